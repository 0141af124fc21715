package router

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// requestSegs builds a routed request of the given segments at block size
// 16, arriving at the given time.
func requestSegs(id int, at time.Duration, segs ...workload.Segment) *Request {
	r := &workload.Request{ID: id, Arrival: at, OutputLen: 1, Prompt: segs}
	for _, s := range segs {
		r.PromptLen += s.Len
	}
	return &Request{Request: r, Content: r.AppendBlockContent(nil, 16, workload.Segment{}), PromptBlocks: r.PromptLen / 16}
}

func route1(t *testing.T, r Router, q *Request) int {
	t.Helper()
	return routeAll(t, r, q)[0]
}

// TestLLMDScores pins the default profile: prefix 3, queue 2 (min-max of
// waiting), KV utilisation 2, on metrics as last polled.
func TestLLMDScores(t *testing.T) {
	f := &fakeFleet{loads: []engine.Load{{Waiting: 4, KVUsage: 0.5}, {KVUsage: 0.2}, {Waiting: 2}}}
	r := mustNew(t, LLMD, Config{Fleet: f, Seed: 1, LRUBlocks: 100})
	p := r.(Poller)
	if p.PollInterval() != 50*time.Millisecond {
		t.Fatalf("poll interval %v", p.PollInterval())
	}
	p.Poll()
	// No prefix anywhere. queue: 0, 1, 0.5; kv: 0.5, 0.8, 1.0; scores 1.0,
	// 3.6, 3.0.
	if got := route1(t, r, request(0, 1, 2)); got != 1 {
		t.Fatalf("first request went to %d, want 1", got)
	}
	// Engine 1 now queues, but the router has not polled: it holds the
	// first of two 64-token blocks, 3 x 0.5 + 3.6 = 5.1.
	f.loads[1] = engine.Load{Waiting: 4, KVUsage: 0.8}
	if got := route1(t, r, request(1, 1, 3)); got != 1 {
		t.Fatalf("before the poll: %d, want 1", got)
	}
	// Polled: queue 0, 0, 1; kv 0.5, 0.2, 1; engine 1 scores 1.5 + 0 + 0.4
	// = 1.9, engine 2 0 + 2 + 2 = 4.
	p.Poll()
	if got := route1(t, r, request(2, 1, 4)); got != 2 {
		t.Fatalf("after the poll: %d, want 2", got)
	}
}

// TestLLMDApproximateMatch pins the producer's blocks and match: 64-token
// blocks with the partial tail, a pod's count of the blocks it holds
// before the first block no pod holds, and an LRU sized in blocks.
func TestLLMDApproximateMatch(t *testing.T) {
	f := &fakeFleet{loads: make([]engine.Load, 2)}
	r := mustNew(t, LLMD, Config{Fleet: f, Seed: 1, LRUBlocks: 100}).(*llmd)
	q := request(0, 1, 2, 3, 4) // 256 tokens: 4 blocks of 64
	if n := r.approxPrefix(q); n != 4 {
		t.Fatalf("%d blocks, want 4", n)
	}
	h := append([]uint64(nil), r.hashes...)
	r.lrus[0].Add(h[0], struct{}{})
	r.lrus[1].Add(h[1], struct{}{})
	r.lrus[0].Add(h[2], struct{}{})
	r.approxPrefix(q)
	if r.matched[0] != 2 || r.matched[1] != 1 {
		t.Fatalf("matched %v, want [2 1]: block 3 counts for pod 0 though it misses block 2", r.matched)
	}
	tail := requestSegs(1, 0, workload.Segment{ID: 1, Len: 64}, workload.Segment{ID: 9, Len: 36})
	if n := r.approxPrefix(tail); n != 2 || r.matched[0] != 1 {
		t.Fatalf("100 tokens: %d blocks, matched %v; want 2 blocks, the first held by pod 0", n, r.matched)
	}
	small := mustNew(t, LLMD, Config{Fleet: f, Seed: 1, LRUBlocks: 2}).(*llmd)
	pick := route1(t, small, request(2, 1, 2, 3))
	if l := small.lrus[pick]; l.Len() != 2 || l.Contains(small.hashes[0]) {
		t.Fatalf("an LRU of 2 blocks holds %d, first block kept %v", l.Len(), l.Contains(small.hashes[0]))
	}
}

// TestLLMDTiesAtRandom: equal scores go to either pod.
func TestLLMDTiesAtRandom(t *testing.T) {
	seen := map[int]bool{}
	for seed := range uint64(32) {
		f := &fakeFleet{loads: make([]engine.Load, 2)}
		seen[route1(t, mustNew(t, LLMD, Config{Fleet: f, Seed: seed}), request(0, 1))] = true
	}
	if !seen[0] || !seen[1] {
		t.Fatalf("ties went only to %v", seen)
	}
}

// TestLLMDPrecise pins the guide's profile: kvindex's prefix in 64-token
// blocks, weights 2 : 1 : 1.
func TestLLMDPrecise(t *testing.T) {
	f := &fakeFleet{loads: make([]engine.Load, 3)}
	kv := &fakeKV{matched: map[string]uint32{"p0": 128, "p1": 64}}
	r := mustNew(t, LLMDPrecise, preciseCfg(f, kv))
	r.(Poller).Poll()
	// 192 tokens, 3 blocks: 2 x 2/3 + 1 + 1 against 2 x 1/3 + 2 and 2.
	if got := route1(t, r, request(0, 1, 2, 3)); got != 0 {
		t.Fatalf("idle fleet: %d, want 0", got)
	}
	// Pod 0 queues 3 and is 90% full: 1.33 + 0 + 0.1 against 0.67 + 1 + 1.
	f.loads[0] = engine.Load{Waiting: 3, KVUsage: 0.9}
	r.(Poller).Poll()
	if got := route1(t, r, request(1, 1, 2, 3)); got != 1 {
		t.Fatalf("busy pod 0: %d, want 1", got)
	}
	// 112 matched tokens are one whole 64-token block.
	kv.matched = map[string]uint32{"p0": 112, "p2": 64}
	f.loads[0] = engine.Load{}
	r.(Poller).Poll()
	lr := r.(*llmd)
	if _, err := lr.precisePrefix(context.Background(), request(2, 1, 2, 3)); err != nil || lr.matched[0] != 1 || lr.matched[2] != 1 {
		t.Fatalf("matched %v (%v), want pods 0 and 2 at one block", lr.matched, err)
	}
}
