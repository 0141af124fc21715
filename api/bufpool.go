package api

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// requestPool is the buffer pool of the requests the codec encodes: size
// classes of powers of two from 32 KiB to 8 MiB, and, unlike gRPC's
// default pool, it does not clear a buffer it hands out (the encoder
// writes every byte it sends). gRPC's default pool has no class between
// 32 KiB and 1 MiB and clears a buffer's whole capacity on every Get, so
// a 32,768-token prompt's 95 KB request cleared 1 MiB: a third of its
// encoding time (BenchmarkCodecMarshal).
type requestPool struct {
	classes [requestPoolClasses]sync.Pool
}

const (
	requestPoolMin     = 15 // 32 KiB: below, gRPC's pooling threshold and tiers do well
	requestPoolClasses = 9  // up to 1<<23, 8 MiB; larger requests are allocated and dropped
)

// class returns the size class of a buffer of n bytes (1<<(min+class)
// bytes) and whether there is one.
func (*requestPool) class(n int) (int, bool) {
	c := max(bits.Len(uint(n-1))-requestPoolMin, 0)
	return c, c < requestPoolClasses
}

// Get returns a buffer of length n whose bytes are not cleared.
func (p *requestPool) Get(n int) *[]byte {
	c, ok := p.class(n)
	if !ok {
		b := make([]byte, n)
		return &b
	}
	if b, _ := p.classes[c].Get().(*[]byte); b != nil {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(requestPoolMin+c))
	return &b
}

// Put keeps b for its class when its capacity is exactly the class's.
func (p *requestPool) Put(b *[]byte) {
	c, ok := p.class(cap(*b))
	if ok && cap(*b) == 1<<(requestPoolMin+c) {
		p.classes[c].Put(b)
	}
}

var _ mem.BufferPool = (*requestPool)(nil)
