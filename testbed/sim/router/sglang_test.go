package router

import (
	"testing"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

func newSGLangTest(t *testing.T, n int, seed uint64) *sglang {
	t.Helper()
	return mustNew(t, SGLang, Config{Fleet: &fakeFleet{loads: make([]engine.Load, n)}, Seed: seed}).(*sglang)
}

// TestSGLangCacheAware pins cache_aware's choices: the tree's worker when
// the match is above 30% of the prompt, else the first least-loaded
// worker, by the gateway's own in-flight counts.
func TestSGLangCacheAware(t *testing.T) {
	r := newSGLangTest(t, 3, 1)
	if got := route1(t, r, request(0, 1, 2)); got != 0 {
		t.Fatalf("empty tree: %d, want 0 (the first least loaded)", got)
	}
	// Half the prompt is in engine 0's tree.
	if got := route1(t, r, request(1, 1, 3)); got != 0 {
		t.Fatalf("50%% match: %d, want 0", got)
	}
	// No match: the least loaded of [2 0 0] is engine 1.
	if got := route1(t, r, request(2, 5, 1, 2, 3)); got != 1 {
		t.Fatalf("no match: %d, want 1", got)
	}
	// 25% match with engine 0: not above 30%, least loaded of [2 1 0].
	if got := route1(t, r, request(3, 1, 7, 8, 9)); got != 2 {
		t.Fatalf("25%% match: %d, want 2", got)
	}
	// Exactly 30% (48 of 160 tokens) is not above: least loaded.
	r.load.n = []int{5, 5, 0}
	route1(t, r, requestSegs(4, 0, workload.Segment{ID: 20, Len: 48}, workload.Segment{ID: 21, Len: 112}))
	r.load.n = []int{0, 5, 5}
	if got := route1(t, r, requestSegs(5, 0, workload.Segment{ID: 20, Len: 48}, workload.Segment{ID: 22, Len: 112})); got != 0 {
		t.Fatalf("30%% match: %d, want 0 (least loaded, not the tree's 2)", got)
	}
	// Finished requests leave the gateway's count.
	r.load = newInflight(3)
	r.load.add(7, 1)
	r.Finished(&workload.Request{ID: 7}, 1)
	if r.load.n[1] != 0 {
		t.Fatalf("in flight after finish: %v", r.load.n)
	}
}

// TestSGLangBalance pins the imbalance rule: max - min > 64 and max > 1.5
// x min sends a request the tree would place on engine 0 to the least
// loaded.
func TestSGLangBalance(t *testing.T) {
	for _, c := range []struct {
		loads []int
		want  int
	}{
		{[]int{100, 30, 40}, 1},   // 70 apart, 100 > 45: least loaded
		{[]int{100, 40, 70}, 0},   // 60 apart: the tree
		{[]int{200, 134, 150}, 0}, // 66 apart but 200 < 201: the tree
		{[]int{200, 130, 150}, 1}, // 70 apart, 200 > 195: least loaded
	} {
		r := newSGLangTest(t, 3, 1)
		route1(t, r, request(0, 1, 2)) // into engine 0's tree
		r.load.n = c.loads
		if got := route1(t, r, request(1, 1, 2)); got != c.want {
			t.Errorf("loads %v: %d, want %d", c.loads, got, c.want)
		}
	}
}

// TestSGLangTreeTenants: the deepest matched node's workers, one at random.
func TestSGLangTreeTenants(t *testing.T) {
	seen := map[int]bool{}
	for seed := range uint64(32) {
		r := newSGLangTest(t, 3, seed)
		route1(t, r, request(0, 1, 2)) // engine 0
		r.path(request(1, 1, 2))
		r.insert(2, 0) // engine 2 holds the same path
		r.load.n = []int{0, 0, 0}
		seen[route1(t, r, request(2, 1, 2))] = true
	}
	if !seen[0] || !seen[2] || seen[1] {
		t.Fatalf("deepest node's workers 0 and 2 got %v", seen)
	}
}

// TestSGLangEviction: every 120 s a worker over the tree limit loses its
// least recently inserted leaves.
func TestSGLangEviction(t *testing.T) {
	r := newSGLangTest(t, 2, 1)
	r.maxHeld = 128
	p0 := requestSegs(0, time.Second, workload.Segment{ID: 1, Len: 64}, workload.Segment{ID: 2, Len: 64})
	p1 := requestSegs(1, 2*time.Second, workload.Segment{ID: 1, Len: 64}, workload.Segment{ID: 3, Len: 64})
	route1(t, r, p0)
	route1(t, r, p1)
	if r.held[0] != 192 {
		t.Fatalf("engine 0 holds %d tokens, want 192", r.held[0])
	}
	// Engine 0 drops prompt 0's tail (inserted at 1 s) and keeps prompt
	// 1's (2 s) and the shared head.
	r.evict()
	if r.held[0] != 128 {
		t.Fatalf("after eviction engine 0 holds %d tokens, want 128", r.held[0])
	}
	held := func(q *Request) (head, tail bool) {
		r.path(q)
		_, head = r.index[r.hashes[0]]
		_, tail = r.index[r.hashes[len(r.hashes)-1]]
		return head, tail
	}
	if head, tail := held(p0); !head || tail {
		t.Fatalf("prompt 0: head kept %v, tail kept %v; want true, false", head, tail)
	}
	if head, tail := held(p1); !head || !tail {
		t.Fatalf("prompt 1: head kept %v, tail kept %v; want both", head, tail)
	}
	// Routing at 121 s runs the pass due at 120 s and schedules the next.
	route1(t, r, requestSegs(2, 121*time.Second, workload.Segment{ID: 9, Len: 16}))
	if r.evictAt != 240*time.Second {
		t.Fatalf("next eviction at %v, want 240s", r.evictAt)
	}
}
