package api

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// requestPool pools the requests the codec encodes or gathers: gRPC's pool up
// to 32 KiB, above power-of-two classes to 8 MiB that do not clear what they
// hand out. gRPC's has no class between 32 KiB and 1 MiB and clears the
// whole capacity per Get: a third of a 95 KB request's encoding time.
type requestPool struct {
	classes [requestPoolClasses]sync.Pool
}

const (
	requestPoolMin     = 15 // 32 KiB and below: gRPC's default pool
	requestPoolClasses = 8  // 64 KiB to 8 MiB; larger requests are allocated and dropped
)

// class returns the size class (1<<(requestPoolMin+1+c) bytes) of n > 32 KiB.
func (*requestPool) class(n int) (int, bool) {
	c := bits.Len(uint(n-1)) - requestPoolMin - 1
	return c, c < requestPoolClasses
}

// Get returns a buffer of length n, not cleared above 32 KiB.
func (p *requestPool) Get(n int) *[]byte {
	if n <= 1<<requestPoolMin {
		return mem.DefaultBufferPool().Get(n)
	}
	c, ok := p.class(n)
	if !ok {
		b := make([]byte, n)
		return &b
	}
	if b, _ := p.classes[c].Get().(*[]byte); b != nil {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(requestPoolMin+1+c))
	return &b
}

// Put gives b back; over 32 KiB only when its capacity is its class's.
func (p *requestPool) Put(b *[]byte) {
	if cap(*b) <= 1<<requestPoolMin {
		mem.DefaultBufferPool().Put(b)
		return
	}
	if c, ok := p.class(cap(*b)); ok && cap(*b) == 1<<(requestPoolMin+1+c) {
		p.classes[c].Put(b)
	}
}

var _ mem.BufferPool = (*requestPool)(nil)
