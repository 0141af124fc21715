package api

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// requestPool is the buffer pool of the requests the codec encodes or
// gathers: up to 32 KiB gRPC's default pool (its tiers fit them), above
// power-of-two classes up to 8 MiB that, unlike gRPC's, do not clear a
// buffer they hand out (the encoder or the copy writes every byte).
// gRPC's default pool has no class between 32 KiB and 1 MiB and clears a
// buffer's whole capacity on every Get, so a 32,768-token prompt's 95 KB
// request cleared 1 MiB: a third of its encoding time
// (BenchmarkCodecMarshal).
type requestPool struct {
	classes [requestPoolClasses]sync.Pool
}

const (
	requestPoolMin     = 15 // 32 KiB and below: gRPC's default pool
	requestPoolClasses = 8  // 64 KiB to 8 MiB; larger requests are allocated and dropped
)

// class returns the size class of a buffer of n > 32 KiB bytes
// (1<<(requestPoolMin+1+class) bytes) and whether there is one.
func (*requestPool) class(n int) (int, bool) {
	c := bits.Len(uint(n-1)) - requestPoolMin - 1
	return c, c < requestPoolClasses
}

// Get returns a buffer of length n; above 32 KiB its bytes are not
// cleared.
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

// Put gives b back to the pool it came from; a buffer over 32 KiB is kept
// when its capacity is exactly its class's.
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
