package sim

import (
	"testing"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

func TestBoundsByHand(t *testing.T) {
	shared := workload.Segment{ID: 7, Len: 64}
	req := func(id int, at time.Duration, segs ...workload.Segment) workload.Request {
		n := 0
		for _, s := range segs {
			n += s.Len
		}
		return workload.Request{ID: id, Arrival: at, Prompt: segs, PromptLen: n, OutputLen: 4}
	}
	w := &workload.Workload{Name: "hand", Requests: []workload.Request{
		req(0, 0, shared, workload.Segment{ID: 100, Len: 16}),           // computes everything
		req(1, time.Second, shared, workload.Segment{ID: 101, Len: 16}), // hits the 4 shared blocks
		req(2, 2*time.Second, shared),                                   // 64 tokens: at most 3 blocks hit
		req(3, 3*time.Second, workload.Segment{ID: 102, Len: 20000}),    // never fits 1,000 blocks
	}}
	// A linear time model, for round numbers.
	o := Options{Engines: 2, Engine: engine.Config{CacheBlocks: 1000, Time: engine.TimeModel{PrefillTokensPerSec: 16000, StepOverhead: 6 * time.Millisecond}}}
	b, err := ComputeBounds(w, o)
	if err != nil {
		t.Fatal(err)
	}
	if b.Requests != 3 || b.PromptTokens != 80+80+64 || b.CachedTokens != 64+48 {
		t.Fatalf("bounds: %d requests, %d prompt tokens, %d cached; want 3, 224, 112", b.Requests, b.PromptTokens, b.CachedTokens)
	}
	// Own prefill alone: 80, 16 and 16 uncached tokens, one 6 ms step each
	// at 16,000 tokens/s.
	want := []time.Duration{7 * time.Millisecond, 7 * time.Millisecond, 11 * time.Millisecond}
	for i, d := range b.TTFT {
		if d != want[i] {
			t.Errorf("TTFT bound %d = %v, want %v", i, d, want[i])
		}
	}
	if b.TTFTP99 != 11*time.Millisecond || b.TTFTP50 != 7*time.Millisecond {
		t.Errorf("p50 %v p99 %v", b.TTFTP50, b.TTFTP99)
	}
	// A long prompt is chunked by the step budget: 20,000 tokens in
	// 8,192-token steps is 3 steps of 6 ms plus 1.25 s of prefill.
	if got := soloPrefill(o.Engine.Time, 0, 20000, 8192); got != 18*time.Millisecond+1250*time.Millisecond {
		t.Errorf("solo prefill of 20,000 tokens = %v, want 1.268s", got)
	}
	// With attention, each chunk attends over what is already computed:
	// 100 tokens after 1,000 cached in two 50-token chunks attend over
	// 50*1000 + 1275 + 50*1050 + 1275 = 105,050 pairs, 105.05 us at 1e9/s.
	tm := engine.TimeModel{PrefillTokensPerSec: 1e6, AttentionPairsPerSec: 1e9}
	if got, want := soloPrefill(tm, 1000, 100, 50), 100*time.Microsecond+105050*time.Nanosecond; got != want {
		t.Errorf("solo prefill with attention = %v, want %v", got, want)
	}
}
