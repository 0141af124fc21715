package router

import (
	"testing"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

func newAIBrixTest(t *testing.T, n int, seed uint64) *aibrix {
	t.Helper()
	return mustNew(t, AIBrix, Config{Fleet: &fakeFleet{loads: make([]engine.Load, n)}, Seed: seed}).(*aibrix)
}

// placed routes q with every other engine 10 requests busier than want, so
// that only want is a candidate and the table records q's blocks on it.
func placed(t *testing.T, r *aibrix, q *Request, want int) {
	t.Helper()
	saved := append([]int(nil), r.load.n...)
	for i := range r.load.n {
		r.load.n[i] = 10
	}
	r.load.n[want] = 0
	if got := route1(t, r, q); got != want {
		t.Fatalf("placing request %d: %d, want %d", q.ID, got, want)
	}
	r.load = newInflight(len(saved))
	copy(r.load.n, saved)
}

// TestAIBrixPrefixCache pins prefix-cache's choice: the best match whose
// load is within the mean + 1 sample standard deviation, else the least
// loaded; only the least loaded when loads are more than 8 apart.
func TestAIBrixPrefixCache(t *testing.T) {
	for _, c := range []struct {
		loads []int
		want  int
	}{
		{[]int{2, 2, 2}, 0},  // sd 0: engine 0 (100%) is within 2
		{[]int{3, 2, 2}, 1},  // mean 2.33 + sd 0.58 = 2.91: 0 is out, 1 (50%) in
		{[]int{4, 4, 1}, 0},  // 3 + 1.73: 0 is within 4.73
		{[]int{6, 6, 2}, 0},  // 4.67 + 2.31 = 6.98
		{[]int{9, 1, 5}, 0},  // 8 apart is balanced; 5 + 4 = 9
		{[]int{10, 1, 1}, 1}, // 9 apart: only 1 and 2; 1 holds 50%
		{[]int{10, 2, 1}, 2}, // 9 apart: only 2, which holds nothing
		{[]int{9, 9, 0}, 2},  // 9 apart: only 2
	} {
		r := newAIBrixTest(t, 3, 1)
		placed(t, r, request(0, 1, 2), 0) // engine 0 holds 8 blocks
		placed(t, r, request(1, 1, 3), 1) // engine 1 the first 4 of them
		copy(r.load.n, c.loads)
		if got := route1(t, r, request(2, 1, 2)); got != c.want {
			t.Errorf("loads %v: %d, want %d", c.loads, got, c.want)
		}
	}
}

// TestAIBrixMatchNarrows: a pod stays a candidate only while it holds
// every block so far, and the match is the held share in whole percent.
func TestAIBrixMatchNarrows(t *testing.T) {
	r := newAIBrixTest(t, 3, 1)
	placed(t, r, request(0, 1, 2, 3), 0) // 12 blocks on 0
	placed(t, r, request(1, 1, 2), 1)    // the first 8 on 1
	placed(t, r, request(2, 1, 4, 3), 2) // the first 4 on 2
	r.hashes = chain(r.hashes[:0], 0x61696272, request(3, 1, 2, 3).Content)
	if !r.match(7, 0) || r.pct[0] != 100 || r.pct[1] != 66 || r.pct[2] != 33 {
		t.Fatalf("match %v, want [100 66 33]", r.pct)
	}
	if !r.match(6, 0) || r.pct[0] != -1 || r.pct[1] != 66 {
		t.Fatalf("engine 0 not a candidate: %v", r.pct)
	}
}

// TestAIBrixTableExpires: table entries expire 20 minutes after a route
// last added to them; the table holds 200,000 / 16 blocks.
func TestAIBrixTableExpires(t *testing.T) {
	r := newAIBrixTest(t, 2, 1)
	if r.tableBlocks != 12500 {
		t.Fatalf("table of %d blocks at 16 tokens, want 12,500", r.tableBlocks)
	}
	placed(t, r, requestSegs(0, time.Minute, workload.Segment{ID: 1, Len: 64}), 1)
	r.hashes = chain(r.hashes[:0], 0x61696272, request(1, 1).Content)
	if !r.match(3, 20*time.Minute) || r.pct[1] != 100 {
		t.Fatalf("at 20 minutes: %v, want engine 1 at 100", r.pct)
	}
	if r.match(3, 22*time.Minute) {
		t.Fatalf("at 22 minutes the entry matched: %v", r.pct)
	}
}

// TestAIBrixLeastLoadedTies: with no match, the least loaded, ties at
// random; Finished frees the count.
func TestAIBrixLeastLoadedTies(t *testing.T) {
	seen := map[int]bool{}
	for seed := range uint64(32) {
		r := newAIBrixTest(t, 3, seed)
		r.load.n = []int{3, 1, 1}
		seen[route1(t, r, request(0, 7))] = true
		r.Finished(&workload.Request{ID: 0}, 0)
		if r.load.n[0]+r.load.n[1]+r.load.n[2] != 5 {
			t.Fatalf("in flight after finish: %v", r.load.n)
		}
	}
	if !seen[1] || !seen[2] || seen[0] {
		t.Fatalf("ties went to %v", seen)
	}
}
