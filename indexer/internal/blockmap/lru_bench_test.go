package blockmap

import (
	"runtime"
	"testing"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// val has the size and shape of the indexer's engine entry before it was
// packed into a word (16 bytes, no pointer), for golang-lru.
type val struct {
	_   uint32   // node
	off int32    // offset in the node
	_   [6]uint8 // store counts
}

// lruOps is what a worker does per block, in the steady state of
// BenchmarkApply: look the new block's hash up (absent), insert it, touch
// its parent, and later find and remove it (its BlockRemoved).
type lruOps interface {
	store(h, parent uint64)
	remove(h uint64)
}

type blockmapOps struct{ m Map }

func (b *blockmapOps) store(h, parent uint64) {
	if _, ok := b.m.Get(h); !ok {
		b.m.Insert(h, 1)
	}
	if s, ok := b.m.Get(parent); ok {
		b.m.Touch(s)
	}
}

func (b *blockmapOps) remove(h uint64) {
	if s, ok := b.m.Get(h); ok {
		b.m.Delete(s)
	}
}

type simplelruOps struct{ l *simplelru.LRU[uint64, val] }

func (g *simplelruOps) store(h, parent uint64) {
	if _, ok := g.l.Peek(h); !ok {
		g.l.Add(h, val{off: 1})
	}
	g.l.Get(parent)
}

func (g *simplelruOps) remove(h uint64) { g.l.Remove(h) }

func newSimplelru() *simplelruOps {
	l, err := simplelru.NewLRU[uint64, val](1<<30, nil)
	if err != nil {
		panic(err)
	}
	return &simplelruOps{l}
}

func hashAt(i int) uint64 { return uint64(i)*0x9e3779b97f4a7c15 | 1<<63 }

// BenchmarkLRU compares this package with golang-lru/v2's simplelru (the
// cheapest golang-lru type: no lock) on a worker's per-block operations at
// 80,000 resident blocks (ns/op is per stored and removed block), and
// measures each one's heap per entry at 1 M entries (bytes/entry).
func BenchmarkLRU(b *testing.B) {
	impls := []struct {
		name string
		make func() lruOps
	}{
		{"blockmap", func() lruOps { return &blockmapOps{} }},
		{"golang-lru", func() lruOps { return newSimplelru() }},
	}
	for _, impl := range impls {
		b.Run(impl.name, func(b *testing.B) {
			const resident = 80000
			m := impl.make()
			for i := range resident {
				m.store(hashAt(i), hashAt(i-1))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := resident; i < resident+b.N; i++ {
				m.store(hashAt(i), hashAt(i-1))
				m.remove(hashAt(i - resident))
			}
		})
		b.Run(impl.name+"/memory", func(b *testing.B) {
			for range b.N {
				const n = 1 << 20
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				m := impl.make()
				for i := range n {
					m.store(hashAt(i), hashAt(i-1))
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/entry")
				runtime.KeepAlive(m)
			}
		})
	}
}
