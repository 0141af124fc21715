package router

import (
	"context"
	"testing"

	"github.com/kvindex/kvindex/testbed/sim/engine"
)

// TestDynamoCost pins cost_w = max(0, (active prefill + ISL) / bs -
// overlap) + potential decode blocks, from the router's own bookkeeping.
func TestDynamoCost(t *testing.T) {
	ctx := context.Background()
	f := &fakeFleet{loads: make([]engine.Load, 3)}
	kv := &fakeKV{matched: map[string]uint32{"p0": 64}}
	r := mustNew(t, Dynamo, preciseCfg(f, kv)).(*dynamo)
	// 128 tokens, 8 blocks: engine 0 costs 8 - 4 + 8 = 12, the others 16.
	q0 := request(0, 1, 2)
	if got := route1(t, r, q0); got != 0 {
		t.Fatalf("first request: %d, want 0", got)
	}
	if r.prefill[0] != 64 || len(r.active[0]) != 8 {
		t.Fatalf("engine 0: %d prefill tokens, %d active blocks; want 64, 8", r.prefill[0], len(r.active[0]))
	}
	// Engine 0: (64 + 128) / 16 - 4 = 8, plus 8 active blocks and the 4
	// not shared with them = 20; engines 1 and 2: 8 + 8 = 16, a tie.
	q1 := request(1, 1, 3)
	other := route1(t, r, q1)
	if other != 1 && other != 2 {
		t.Fatalf("second request: %d, want 1 or 2", other)
	}
	spare := 3 - other
	// Request 0's prefill done: engine 0 costs 128/16 - 6 + 8 + 4 = 14 with
	// 96 tokens cached; the spare engine 16, the other 16 + 8 + 8 = 32.
	if err := r.PrefillDone(ctx, q0.Request, 0); err != nil {
		t.Fatal(err)
	}
	kv.matched = map[string]uint32{"p0": 96}
	if got := route1(t, r, request(2, 1, 4)); got != 0 {
		t.Fatalf("third request: %d, want 0 (the spare engine %d costs 16)", got, spare)
	}
	if r.prefill[0] != 32 || len(r.active[0]) != 12 {
		t.Fatalf("engine 0: %d prefill tokens, %d distinct active blocks; want 32, 12", r.prefill[0], len(r.active[0]))
	}
	// Request 0 finishes: its 4 blocks of segment 2 leave; segment 1's stay
	// for request 2.
	r.Finished(q0.Request, 0)
	if len(r.active[0]) != 8 || r.prefill[0] != 32 {
		t.Fatalf("after finish: %d active blocks, %d prefill; want 8, 32", len(r.active[0]), r.prefill[0])
	}
	// A request finished without its prefill done (rejected) returns both.
	r.Finished(q1.Request, other)
	if len(r.active[other]) != 0 || r.prefill[other] != 0 {
		t.Fatalf("rejected request left %d blocks, %d prefill", len(r.active[other]), r.prefill[other])
	}
}

// TestDynamoTiesAtRandom: equal costs go to either worker.
func TestDynamoTiesAtRandom(t *testing.T) {
	seen := map[int]bool{}
	for seed := range uint64(32) {
		f := &fakeFleet{loads: make([]engine.Load, 2)}
		cfg := preciseCfg(f, &fakeKV{})
		cfg.Seed = seed
		seen[route1(t, mustNew(t, Dynamo, cfg), request(0, 1))] = true
	}
	if !seen[0] || !seen[1] {
		t.Fatalf("ties went only to %v", seen)
	}
}
