package soak

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func newCache(t *testing.T, capacity int, randomEvict float64) *Cache {
	t.Helper()
	c, err := NewCache(4, capacity, 99, randomEvict, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Block hashes chain: a shared prefix has the same hashes, a change in
// one block changes it and every later one, a partial block has none.
func TestBlockHashesChain(t *testing.T) {
	a := BlockHashes(7, 4, seq(0, 14), nil)
	if len(a) != 3 {
		t.Fatalf("%d hashes for 14 tokens of 4-token blocks, want 3", len(a))
	}
	b := BlockHashes(7, 4, append(seq(0, 8), 100, 101, 102, 103), nil)
	if a[0] != b[0] || a[1] != b[1] || a[2] == b[2] {
		t.Fatalf("shared prefix: %x vs %x", a, b)
	}
	c := BlockHashes(7, 4, append([]uint32{42}, seq(1, 11)...), nil)
	for i := range c {
		if c[i] == a[i] {
			t.Fatalf("block %d hash unchanged after block 0 changed", i)
		}
	}
	if d := BlockHashes(8, 4, seq(0, 12), nil); d[0] == a[0] {
		t.Fatal("another hash seed gave the same hash")
	}
}

// A request caches its uncached blocks in one BlockStored whose parent is
// the last cached block; a repeated prompt stores nothing.
func TestRequestStoresOnlyWhatIsMissing(t *testing.T) {
	c := newCache(t, 100, 0)
	evs := c.Request(seq(0, 10), nil) // 2 full blocks and a partial one
	if len(evs) != 1 || evs[0].Kind != events.KindBlockStored || len(evs[0].BlockHashes) != 2 || evs[0].HasParent || len(evs[0].TokenIDs) != 8 {
		t.Fatalf("first request: %+v", evs)
	}
	if n := c.LongestPrefix(seq(0, 10)); n != 2 {
		t.Fatalf("longest prefix %d, want 2", n)
	}
	evs = c.Request(seq(0, 16), nil)
	if len(evs) != 1 || len(evs[0].BlockHashes) != 2 || !evs[0].HasParent || evs[0].ParentHash != c.hashes[1] {
		t.Fatalf("extending request: %+v", evs)
	}
	if evs := c.Request(seq(0, 16), nil); len(evs) != 0 {
		t.Fatalf("cached prompt stored again: %+v", evs)
	}
	if c.Resident() != 4 || c.Physical() != 4 {
		t.Fatalf("resident %d physical %d, want 4 and 4", c.Resident(), c.Physical())
	}
	// The prefix stops at the first block not held.
	if n := c.LongestPrefix(append(seq(0, 4), append([]uint32{999}, seq(5, 11)...)...)); n != 1 {
		t.Fatalf("prefix over a changed second block: %d, want 1", n)
	}
}

// Eviction is vLLM's: the least recently used request's blocks go first,
// its last block first, one BlockRemoved per block, and the cache never
// holds more than its capacity.
func TestEvictionOrder(t *testing.T) {
	c := newCache(t, 6, 0)
	a, b := seq(0, 12), seq(1000, 12) // 3 blocks each
	c.Request(a, nil)
	c.Request(b, nil)
	evs := c.Request(seq(2000, 8), nil) // 2 blocks: evict 2 of a's, tail first
	ah := BlockHashes(99, 4, a, nil)
	if len(evs) != 3 || evs[0].Kind != events.KindBlockRemoved || evs[1].Kind != events.KindBlockRemoved || evs[2].Kind != events.KindBlockStored {
		t.Fatalf("events: %+v", evs)
	}
	if got := []uint64{evs[0].BlockHashes[0], evs[1].BlockHashes[0]}; !slices.Equal(got, []uint64{ah[2], ah[1]}) {
		t.Fatalf("evicted %x, want a's last two blocks %x", got, []uint64{ah[2], ah[1]})
	}
	if n := c.LongestPrefix(a); n != 1 {
		t.Fatalf("a keeps %d blocks, want its first", n)
	}
	// Reusing b makes a's head the oldest.
	c.Request(b, nil)
	evs = c.Request(seq(3000, 4), nil)
	if len(evs) != 2 || evs[0].BlockHashes[0] != ah[0] {
		t.Fatalf("after b was reused: %+v, want a's head evicted", evs)
	}
	if c.Physical() > c.capacity {
		t.Fatalf("%d physical blocks over capacity %d", c.Physical(), c.capacity)
	}
}

// A prompt longer than the cache is served for the blocks that fit.
func TestRequestLongerThanCache(t *testing.T) {
	c := newCache(t, 3, 0)
	evs := c.Request(seq(0, 40), nil)
	if len(evs) != 1 || len(evs[0].BlockHashes) != 3 || c.Resident() != 3 {
		t.Fatalf("events %+v, resident %d", evs, c.Resident())
	}
}

// replica applies a cache's events the way an exact index must: a count
// of stores per engine hash, minus removals, forgotten on a clear.
type replica struct {
	refs map[uint64]int
}

func (r *replica) apply(t *testing.T, evs []events.Event) {
	t.Helper()
	for _, ev := range evs {
		switch ev.Kind {
		case events.KindAllBlocksCleared:
			clear(r.refs)
		case events.KindBlockRemoved:
			for _, h := range ev.BlockHashes {
				if r.refs[h] == 0 {
					t.Fatalf("removal of block %x that is not held", h)
				}
				if r.refs[h]--; r.refs[h] == 0 {
					delete(r.refs, h)
				}
			}
		case events.KindBlockStored:
			if ev.HasParent && r.refs[ev.ParentHash] == 0 {
				t.Fatalf("store under parent %x that is not held", ev.ParentHash)
			}
			for _, h := range ev.BlockHashes {
				r.refs[h]++
			}
		}
	}
}

// Whatever the eviction order, the events a cache sends keep an exact
// replica of it: the same blocks with the same copies, every removal of
// a held block, every store under a held parent. Pure LRU never leaves a
// hole (each cached block's parent is cached, so no block is cached
// twice); evictions out of order do, and blocks are then cached twice.
func TestEventsKeepAnExactReplica(t *testing.T) {
	for _, randomEvict := range []float64{0, 0.3} {
		c := newCache(t, 64, randomEvict)
		r := &replica{refs: map[uint64]int{}}
		rng := rand.New(rand.NewPCG(3, 4))
		systems := [][]uint32{seq(0, 22), seq(500, 9)}
		wl, err := NewWorkload(WorkloadOptions{Conversations: 5, MaxTurns: 5, MaxTokens: 120, UserTokens: 10, ReplyTokens: 14, OneShot: 0.2}, systems, rng)
		if err != nil {
			t.Fatal(err)
		}
		dups := 0
		for step := 0; step < 3000; step++ {
			var evs []events.Event
			if step%997 == 996 {
				evs = append(evs, c.Clear())
			} else {
				evs = c.Request(wl.Next(), nil)
			}
			r.apply(t, evs)
			if len(r.refs) != c.Resident() {
				t.Fatalf("step %d: replica holds %d blocks, cache %d", step, len(r.refs), c.Resident())
			}
			for h, n := range r.refs {
				e := c.held[h]
				if e == nil || len(e.copies) != n {
					t.Fatalf("step %d: block %x: replica %d copies, cache %v", step, h, n, e)
				}
				if n > 1 {
					dups++
				}
				if randomEvict == 0 && e.hasParent && c.held[e.parent] == nil {
					t.Fatalf("step %d: pure LRU left block %x without its parent", step, h)
				}
			}
			if c.Physical() > c.capacity {
				t.Fatalf("step %d: %d physical blocks, capacity %d", step, c.Physical(), c.capacity)
			}
		}
		if randomEvict == 0 && dups != 0 {
			t.Fatalf("pure LRU cached %d blocks twice", dups)
		}
		if randomEvict > 0 && dups == 0 {
			t.Fatal("random evictions never left a block cached twice: the test does not cover holes")
		}
	}
}

// The model agrees with kvindex's own index: the cache's events applied
// to an indexer.Worker give, for every prompt, the longest prefix the
// cache computes, and the same resident count.
func TestTruthMatchesTheIndexer(t *testing.T) {
	ix := indexer.New(indexer.Config{})
	m, err := ix.AddModel("m", 4)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "p"}, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	c := newCache(t, 80, 0.2)
	wl, err := NewWorkload(WorkloadOptions{Conversations: 6, MaxTurns: 6, MaxTokens: 150, UserTokens: 12, ReplyTokens: 20, OneShot: 0.2}, [][]uint32{seq(0, 30), seq(700, 13)}, rand.New(rand.NewPCG(5, 6)))
	if err != nil {
		t.Fatal(err)
	}
	var prompts [][]uint32
	for step := 0; step < 2000; step++ {
		p := wl.Next()
		prompts = append(prompts, p)
		evs := c.Request(p, nil)
		if step%701 == 700 {
			evs = append(evs, c.Clear())
		}
		if err := w.ApplyBatch(&events.Batch{Events: evs}); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if step%50 != 0 {
			continue
		}
		if got := w.Stats().ResidentBlocks; got != int64(c.Resident()) {
			t.Fatalf("step %d: indexer holds %d blocks, cache %d", step, got, c.Resident())
		}
		for _, q := range prompts[max(0, len(prompts)-40):] {
			want := c.LongestPrefix(q)
			got := 0
			for _, mt := range ix.Match(m.PromptKeys(q, nil, nil), nil, nil) {
				got = mt.Blocks
			}
			if got != want {
				t.Fatalf("step %d: indexer matches %d blocks of a %d-token prompt, the cache holds %d", step, got, len(q), want)
			}
		}
	}
}

// Chain returns a cached chain from its root, which the cache holds in
// full.
func TestChain(t *testing.T) {
	c := newCache(t, 50, 0)
	if c.Chain(rand.New(rand.NewPCG(1, 1))) != nil {
		t.Fatal("chain of an empty cache")
	}
	c.Request(seq(0, 20), nil)
	c.Request(append(seq(0, 8), seq(300, 12)...), nil)
	rng := rand.New(rand.NewPCG(1, 1))
	for range 20 {
		p := c.Chain(rng)
		if len(p) == 0 || len(p)%4 != 0 || c.LongestPrefix(p) != len(p)/4 {
			t.Fatalf("chain of %d tokens, cached prefix %d", len(p), c.LongestPrefix(p))
		}
	}
	c.Clear()
	if c.Resident() != 0 || c.Physical() != 0 || c.LongestPrefix(seq(0, 20)) != 0 || c.Chain(rng) != nil {
		t.Fatal("clear left blocks")
	}
}

// Holds and Hashes name exactly the blocks the cache holds.
func TestHoldsAndHashes(t *testing.T) {
	c := newCache(t, 3, 0)
	c.Request(seq(0, 8), nil) // two blocks
	hs := BlockHashes(99, 4, seq(0, 8), nil)
	got := c.Hashes(nil)
	slices.Sort(got)
	want := slices.Sorted(slices.Values(hs))
	if !slices.Equal(got, want) || !c.Holds(hs[0]) || !c.Holds(hs[1]) {
		t.Fatalf("hashes %x, want %x", got, want)
	}
	c.Request(seq(100, 8), nil) // evicts the tail of the first chain
	if c.Holds(hs[1]) || !c.Holds(hs[0]) || len(c.Hashes(nil)) != 3 {
		t.Fatalf("after an eviction: holds %v %v, %d hashes", c.Holds(hs[0]), c.Holds(hs[1]), len(c.Hashes(nil)))
	}
}

func TestNewCacheRejects(t *testing.T) {
	for _, tc := range []struct {
		bs, capacity int
		random       float64
		rng          *rand.Rand
	}{{0, 10, 0, nil}, {4, 0, 0, nil}, {4, 10, 1.5, nil}, {4, 10, 0.5, nil}} {
		if _, err := NewCache(tc.bs, tc.capacity, 1, tc.random, tc.rng); err == nil {
			t.Errorf("NewCache(%d, %d, %v) accepted", tc.bs, tc.capacity, tc.random)
		}
	}
}

// A workload is deterministic in its seed, and every prompt starts with
// one of the system prompts.
func TestWorkloadDeterministic(t *testing.T) {
	systems := SystemPrompts(1, "m", 16, 3)
	if other := SystemPrompts(1, "m", 16, 3); !slices.Equal(systems[2], other[2]) {
		t.Fatal("system prompts differ for one seed")
	}
	if other := SystemPrompts(1, "n", 16, 3); slices.Equal(systems[0], other[0]) {
		t.Fatal("two models share system prompts")
	}
	gen := func() [][]uint32 {
		wl, err := NewWorkload(DefaultWorkloadOptions(), systems, rand.New(rand.NewPCG(9, 9)))
		if err != nil {
			t.Fatal(err)
		}
		var out [][]uint32
		for range 200 {
			out = append(out, wl.Next())
		}
		return out
	}
	a, b := gen(), gen()
	for i := range a {
		if !slices.Equal(a[i], b[i]) {
			t.Fatalf("prompt %d differs between runs of one seed", i)
		}
		ok := false
		for _, s := range systems {
			ok = ok || (len(a[i]) > len(s) && slices.Equal(a[i][:len(s)], s))
		}
		if !ok {
			t.Fatalf("prompt %d does not start with a system prompt", i)
		}
	}
	if _, err := NewWorkload(DefaultWorkloadOptions(), nil, rand.New(rand.NewPCG(1, 1))); err == nil {
		t.Fatal("workload without system prompts accepted")
	}
}
