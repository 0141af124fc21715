package scoring

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

func TestSharedDepth(t *testing.T) {
	want := []int{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64}
	for i, w := range want {
		if got := SharedDepth(i); got != w {
			t.Errorf("SharedDepth(%d) = %d, want %d", i, got, w)
		}
	}
	if got := SharedDepth(MaxSharedDepths - 1); got != 1<<16 {
		t.Errorf("last depth %d, want 65536", got)
	}
	// sharedWithin counts the depths of at most b blocks.
	for b := 0; b <= 1<<17; b++ {
		n := 0
		for n < 40 && SharedDepth(n) <= b {
			n++
		}
		if got := sharedWithin(b); got != n {
			t.Fatalf("sharedWithin(%d) = %d, want %d", b, got, n)
		}
	}
}

// A hot prefix held by few candidates brings them more than the fleet's
// average per worker; one held by all, or a candidate holding nothing,
// the average; the largest of the depths' estimates counts.
func TestArrivalsByHand(t *testing.T) {
	pr := prompt64
	pr.ArrivalRate, pr.Workers, pr.SharedDepths = 8, 4, 12 // depths 1 to 64
	for i := range pr.SharedDepths {
		pr.SharedRates[i] = 4 // half the requests share the whole prompt
	}
	arrivals := func(matched ...int) []float64 {
		cs := make([]Candidate, len(matched))
		for i, m := range matched {
			cs[i] = cand(i, m, 0, Load{})
		}
		var h holders
		h.count(&pr, cs)
		out := make([]float64, len(cs))
		for i := range cs {
			out[i] = pr.arrivals(&cs[i], &h)
		}
		return out
	}
	// Two holders of 4/s: 4/4 of the rest + 4/2; the others the average.
	if got := arrivals(64, 64, 0, 0); !near(got[0], 3) || !near(got[1], 3) || !near(got[2], 2) {
		t.Errorf("two holders: %v/s, want 3, 3, 2, 2", got)
	}
	// The only holder of the first 12 blocks (shared by 4/s), past which
	// the prompt is its own (0.5/s): the shared depth counts, 1 + 4 = 5/s
	// (the deepest alone would say 7.5/4 + 0.5 = 2.375).
	for i := 7; i < pr.SharedDepths; i++ {
		pr.SharedRates[i] = 0.5
	}
	if got := arrivals(64, 0, 0, 0); !near(got[0], 5) {
		t.Errorf("only holder of a shared 12 blocks: %v/s, want 5", got)
	}
	// Shared by every request and held by every worker: the average.
	for i := range pr.SharedDepths {
		pr.SharedRates[i] = 8
	}
	if got := arrivals(64, 64, 64, 64); !near(got[0], 2) {
		t.Errorf("universal prefix: %v/s, want 2", got)
	}
	// A rate above the fleet's (a collision, a burst) counts as the
	// fleet's: 8/s over the 3 holders of the first block.
	pr.SharedRates[0] = 100
	if got := arrivals(1, 64, 64, 0); !near(got[0], 8.0/3) {
		t.Errorf("capped: %v/s, want 8/3", got)
	}
	pr.ArrivalRate = 0
	if got := arrivals(64); got[0] != 0 {
		t.Errorf("no rate known: %v", got)
	}
}

// Relief by hand: a prefix held by one candidate whose TTFT is 1 s,
// shared by 6 requests a second (more than a worker's 2/s); a second
// holder would take 3/s of them over the 1 / (1 - rho) s the holder's
// backlog drains, each waiting half the difference less.
func TestReliefByHand(t *testing.T) {
	pr := prompt64
	pr.ArrivalRate, pr.Workers, pr.SharedDepths = 8, 4, 12
	for i := range pr.SharedDepths {
		pr.SharedRates[i] = 6
	}
	cs := []Candidate{cand(0, 64, 0, Load{}), cand(1, 0, 0, Load{}), cand(2, 0, 0, Load{})}
	cs[0].Est.Wait = 1
	cs[1].Est.Prefill = 0.2
	cs[2].Est.Prefill = 1.5 // slower than the holder: no relief
	var h holders
	h.count(&pr, cs)
	h.fastest(cs)
	for i := range cs {
		pr.relief(&cs[i], &h, 0.5)
	}
	if want := 3 * (1 / 0.5) * (1 - 0.2) / 2; !near(cs[1].Est.Relief, want) {
		t.Errorf("relief %v, want %v", cs[1].Est.Relief, want)
	}
	if cs[0].Est.Relief != 0 || cs[2].Est.Relief != 0 {
		t.Errorf("relief for the holder %v and a slower worker %v, want 0", cs[0].Est.Relief, cs[2].Est.Relief)
	}
	if !near(cs[1].Est.Cost(), 0.2-2.4) {
		t.Errorf("cost %v, want prefill less relief", cs[1].Est.Cost())
	}
	// Held by a second candidate already: a third takes 2/s.
	cs = append(cs, cand(3, 64, 0, Load{}))
	cs[3].Est.Wait = 1
	h.count(&pr, cs)
	h.fastest(cs)
	if pr.relief(&cs[1], &h, 0.5); !near(cs[1].Est.Relief, 2*(1/0.5)*(1-0.2)/2) {
		t.Errorf("third holder's relief %v, want %v", cs[1].Est.Relief, 2*(1/0.5)*(1-0.2)/2)
	}
	// A prefix that brings its holders less than a worker's share (2/s)
	// is cold: their backlog is not its doing.
	for i := range pr.SharedDepths {
		pr.SharedRates[i] = 3.9 // 1.95/s for each of the two holders
	}
	if pr.relief(&cs[1], &h, 0.5); cs[1].Est.Relief != 0 {
		t.Errorf("relief %v for a cold prefix", cs[1].Est.Relief)
	}
	// Nobody else shares the prompt: nothing to relieve.
	clear(pr.SharedRates[:])
	if pr.relief(&cs[1], &h, 0.5); cs[1].Est.Relief != 0 {
		t.Errorf("relief %v for an unshared prompt", cs[1].Est.Relief)
	}
}

// A request whose prefix only a busy worker holds stays there when few
// requests share the prefix, and spills (making it cached on a second
// worker) when many do: they queue behind the holder (Delay) and a copy
// divides them (Relief).
func TestTTFTGuardReplicatesHotPrefix(t *testing.T) {
	p := DefaultPolicy()
	p.Cost.PrefillTokensPerSec, p.Cost.AttentionPairsPerSec, p.Cost.KVCapacityTokens = 16000, 0, 0
	run := func(shared float64) []Candidate {
		// 16 requests/s over 4 workers, 512 uncached tokens each: rho 0.128.
		pr := Prompt{Blocks: 256, Tokens: 4096, BlockSize: 16, AvgPromptTokens: 1024, ArrivalRate: 16, Workers: 4, AvgUncachedTokens: 512}
		pr.SharedDepths = 16 // 1 to 256 blocks
		for i := range pr.SharedDepths {
			pr.SharedRates[i] = shared
		}
		cs := []Candidate{
			cand(0, 250, 0, Load{InflightPrefillTokens: 7000}),
			cand(1, 0, 0, Load{}), cand(2, 0, 0, Load{}), cand(3, 0, 0, Load{}),
		}
		p.Rank(pr, cs, names(4))
		return cs
	}
	// a waits 443.5 ms and prefills 96 tokens in 6 ms; elsewhere 4,096
	// tokens take 262 ms and delay the 4/s that arrive behind them by
	// 315 ms.
	// Cold (0.5/s share the prompt, less than a worker's 4/s): 4.4/s
	// reach a, 13.5 ms of delay, no relief: a costs 463 ms, a spill
	// 577 ms.
	if cs := run(0.5); cs[0].Match.Worker != 0 || !near3(cs[0].Est.Cost(), 0.4630) || !near3(cs[1].Est.Cost(), 0.5769) || cs[1].Est.Relief != 0 {
		t.Errorf("cold prefix: %+v, want a first at 463 ms, then 577 ms", cs[:2])
	}
	// Hot (12/s share it, all reaching a): 13/s, 40 ms of delay; a copy
	// would take 6/s for the 0.51 s a's backlog drains, each waiting
	// 94 ms less: 290 ms of relief, and the spill costs 287 ms.
	if cs := run(12); cs[0].Match.Worker == 0 || !near3(cs[0].Est.Cost(), 0.2869) || !near3(cs[3].Est.Cost(), 0.4897) {
		t.Errorf("hot prefix: %+v, want a spill at 287 ms, a last at 490 ms", cs)
	}
}

func near3(a, b float64) bool { return a-b < 5e-4 && b-a < 5e-4 }

// Route counts the routes sharing each sampled prefix depth, on the
// tracker's clock; a prompt nobody shared has no rate.
func TestScorerLearnsSharedRates(t *testing.T) {
	f := newTestFleet(t, 4)
	now := time.Unix(1000, 0)
	s := New(f.ix, Options{Tracker: NewTracker(TrackerOptions{Now: func() time.Time { return now }})})
	r := rand.New(rand.NewPCG(5, 5))
	shared := tokens(r, 3*testBS)
	var res Result
	for i := range 3 {
		// Three blocks in common, a fourth of its own.
		p := append(append([]uint32(nil), shared...), tokens(r, testBS)...)
		if _, err := s.Route("r"+strconv.Itoa(i), "", &Request{Model: f.model, Tokens: p}, nil, &res); err != nil {
			t.Fatal(err)
		}
		now = now.Add(250 * time.Millisecond)
	}
	p := append(append([]uint32(nil), shared...), tokens(r, testBS)...)
	if err := s.Score(&Request{Model: f.model, Tokens: p}, &res); err != nil {
		t.Fatal(err)
	}
	// Depths 1, 2, 3 are shared (4 routes a second), depth 4 is new.
	pr := res.Prompt
	if pr.SharedDepths != 4 || !near(pr.SharedRates[0], 4) || !near(pr.SharedRates[2], 4) || pr.SharedRates[3] != 0 {
		t.Fatalf("shared rates %v over %d depths, want 4/s at depths 1-3 and 0 at 4", pr.SharedRates[:4], pr.SharedDepths)
	}
	if err := s.Score(&Request{Model: f.model, Tokens: tokens(r, 4*testBS)}, &res); err != nil {
		t.Fatal(err)
	}
	if got := res.Prompt.SharedRates[0]; got != 0 {
		t.Errorf("unshared prompt's rate %v", got)
	}
}
