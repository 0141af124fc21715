package scoring

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

func names(n int) []events.WorkerRef {
	out := make([]events.WorkerRef, n)
	for i := range out {
		out[i] = events.WorkerRef{Pod: string(rune('a' + i))}
	}
	return out
}

func cand(w int, gpu, cpu int, l Load) Candidate {
	var m indexer.Match
	m.Worker = indexer.WorkerID(w)
	m.ByMedium[events.MediumGPU] = gpu
	m.ByMedium[events.MediumCPU] = cpu
	m.Blocks = max(gpu, cpu)
	return Candidate{Match: m, Load: l}
}

func order(cs []Candidate) []indexer.WorkerID {
	out := make([]indexer.WorkerID, len(cs))
	for i, c := range cs {
		out[i] = c.Match.Worker
	}
	return out
}

var prompt64 = Prompt{Blocks: 64, Tokens: 64 * 16, BlockSize: 16, AvgPromptTokens: 1024}

func TestWeightedOverlap(t *testing.T) {
	p := DefaultPolicy()
	for _, tc := range []struct {
		gpu, cpu, blocks int
		want             float64
	}{
		{10, 0, 10, 10},
		{0, 10, 10, 8},   // CPU at 0.8
		{4, 10, 10, 8.8}, // 4 at 1.0, 6 more at 0.8
		{10, 4, 10, 10},  // CPU prefix inside GPU's
		{2, 3, 6, 2 + 0.8 + 3*0.8},
	} {
		var m indexer.Match
		m.ByMedium[events.MediumGPU], m.ByMedium[events.MediumCPU], m.Blocks = tc.gpu, tc.cpu, tc.blocks
		if got := p.weightedBlocks(&m); got < tc.want-1e-9 || got > tc.want+1e-9 {
			t.Errorf("gpu %d cpu %d any %d: weighted %v, want %v", tc.gpu, tc.cpu, tc.blocks, got, tc.want)
		}
	}
}

// Property tests over random candidates, for every policy and guard.
func TestRankProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	policies := []Policy{DefaultPolicy()}
	for _, g := range []Guard{GuardCost, GuardStatic, GuardOff} {
		p := DefaultPolicy()
		p.Guard = g
		policies = append(policies, p)
	}
	lp := DefaultPolicy()
	lp.Name = LongestPrefix
	policies = append(policies, lp)
	for iter := 0; iter < 2000; iter++ {
		pol := policies[iter%len(policies)]
		n := 2 + rng.IntN(6)
		cs := make([]Candidate, n)
		sameLoad := Load{Running: uint32(rng.IntN(4)), InflightRequests: uint32(rng.IntN(3)), InflightPrefillTokens: uint64(rng.IntN(4000))}
		for i := range cs {
			cs[i] = cand(i, rng.IntN(65), 0, sameLoad)
		}
		pol.Rank(prompt64, cs, names(n))
		// A worker with a longer GPU prefix and equal load ranks higher.
		for i := 1; i < n; i++ {
			if cs[i].Match.Blocks > cs[i-1].Match.Blocks {
				t.Fatalf("%v/%v: %d GPU blocks ranked below %d at equal load: %+v", pol.Name, pol.Guard, cs[i].Match.Blocks, cs[i-1].Match.Blocks, cs)
			}
		}
		// Equal overlap ranks by load.
		blocks := rng.IntN(65)
		for i := range cs {
			cs[i] = cand(i, blocks, 0, Load{InflightRequests: uint32(i % 3), InflightPrefillTokens: uint64(1000 * rng.IntN(5))})
		}
		pol.Rank(prompt64, cs, names(n))
		for i := 1; i < n; i++ {
			if cs[i].Diverted == cs[i-1].Diverted && cs[i].Queue < cs[i-1].Queue {
				t.Fatalf("%v/%v: queue %v ranked below %v at equal overlap", pol.Name, pol.Guard, cs[i].Queue, cs[i-1].Queue)
			}
		}
	}
}

// costPolicy is DefaultPolicy with the token-cost guard.
func costPolicy() Policy {
	p := DefaultPolicy()
	p.Guard = GuardCost
	return p
}

func TestCostGuardDivertsWhenQueueOutweighsCache(t *testing.T) {
	p := costPolicy()
	p.LoadWeight = 1
	// a holds the whole 1024-token prompt but has 2048 tokens queued; b
	// holds nothing and is idle: recomputing 1024 beats waiting for 2048.
	cs := []Candidate{
		cand(0, 64, 0, Load{InflightPrefillTokens: 2048, InflightRequests: 1}),
		cand(1, 0, 0, Load{}),
	}
	p.Rank(prompt64, cs, names(2))
	if got := order(cs); got[0] != 1 {
		t.Fatalf("order %v, want b first: %+v", got, cs)
	}
	if cs[0].Score != -1024 || cs[1].Score != -2048 {
		t.Fatalf("scores %v %v, want -1024 -2048", cs[0].Score, cs[1].Score)
	}
	// With the default weight a queued token counts a third: a stays
	// until its queue passes three times the prefill it saves.
	p = costPolicy()
	for _, tc := range []struct {
		queue uint64
		first indexer.WorkerID
	}{{3000, 0}, {3100, 1}} {
		cs = []Candidate{cand(0, 64, 0, Load{InflightPrefillTokens: tc.queue}), cand(1, 0, 0, Load{})}
		p.Rank(prompt64, cs, names(2))
		if got := order(cs); got[0] != tc.first {
			t.Fatalf("queue %d: order %v, want %d first", tc.queue, got, tc.first)
		}
	}
	cs = []Candidate{cand(0, 64, 0, Load{InflightPrefillTokens: 600}), cand(1, 0, 0, Load{})}
	p.Rank(prompt64, cs, names(2))
	if s := p.Explain(prompt64, &cs[0]); s != "64/64 blocks cached (GPU 64); cost = 0 own prefill + 0.3 x 600 queued = 200 tokens" {
		t.Fatalf("explain: %q", s)
	}
}

func TestStaticGuardDivertsAboveKTimesMedian(t *testing.T) {
	p := DefaultPolicy()
	p.Guard = GuardStatic
	cs := []Candidate{
		cand(0, 64, 0, Load{InflightRequests: 7}), // > 2 x median 3
		cand(1, 10, 0, Load{InflightRequests: 3}),
		cand(2, 0, 0, Load{InflightRequests: 3}),
	}
	p.Rank(prompt64, cs, names(3))
	if got := order(cs); got[0] != 1 || got[1] != 2 || got[2] != 0 || !cs[2].Diverted || cs[2].Penalty != 1024 {
		t.Fatalf("order %v: %+v", got, cs)
	}
	if s := p.Explain(prompt64, &cs[2]); s != "64/64 blocks cached (GPU 64); cost = 0 own prefill tokens; diverted: 7 in flight > 2.0 x median" {
		t.Fatalf("explain: %q", s)
	}
}

func TestOverrideValidates(t *testing.T) {
	base := DefaultPolicy()
	p, err := Override{Name: "longest_prefix", CPUWeight: 0.5, Guard: "static", StaticK: 3}.Apply(base)
	if err != nil || p.Name != LongestPrefix || p.Weights[events.MediumCPU] != 0.5 || p.Guard != GuardStatic || p.StaticK != 3 || p.Weights[events.MediumGPU] != 1 {
		t.Fatalf("%+v %v", p, err)
	}
	for _, g := range []Guard{GuardTTFT, GuardCost, GuardStatic, GuardOff} {
		if p, err := (Override{Guard: g.String()}).Apply(base); err != nil || p.Guard != g {
			t.Errorf("guard %s: %v %v", g, p.Guard, err)
		}
	}
	if base.Guard != GuardTTFT || base.Cost != DefaultCostModel() {
		t.Errorf("DefaultPolicy: guard %v, cost model %+v", base.Guard, base.Cost)
	}
	for _, o := range []Override{{Name: "fastest"}, {Guard: "maybe"}, {LoadWeight: -1}, {GPUWeight: 1e9}} {
		if _, err := o.Apply(base); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

func TestTrackerSpeculativeAndLoad(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	tr := NewTracker(TrackerOptions{SpecTTL: 5 * time.Second, FlightTTL: 30 * time.Second, Now: clock})
	keys := []indexer.Key{1, 2, 3, 4, 5}
	if err := tr.Record("r1", "", 3, 0, keys, 80); err != nil {
		t.Fatal(err)
	}
	if err := tr.Record("r1", "", 3, 0, keys, 80); err == nil {
		t.Fatal("duplicate id accepted")
	}
	if n, tok := tr.Load(3, 0); n != 1 || tok != 80 {
		t.Fatalf("load %d %d", n, tok)
	}
	specs := func(keys []indexer.Key) map[indexer.WorkerID]int {
		got := map[indexer.WorkerID]int{}
		for _, s := range tr.Speculative(keys, nil) {
			got[s.Worker] = s.Blocks
		}
		return got
	}
	// Shares the first 3 keys (chained keys: equal at 2 means equal before).
	if got := specs([]indexer.Key{1, 2, 3, 9, 9, 9}); got[3] != 3 || len(got) != 1 {
		t.Fatalf("speculative %v", got)
	}
	now = now.Add(6 * time.Second) // speculative entries expire first
	if got := specs(keys); len(got) != 0 {
		t.Fatalf("expired speculative still visible: %v", got)
	}
	release := func(id string) bool {
		ok, err := tr.Release(id, "")
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !release("r1") || release("r1") {
		t.Fatal("release")
	}
	if n, tok := tr.Load(3, 0); n != 0 || tok != 0 {
		t.Fatalf("load after release %d %d", n, tok)
	}
	tr.Record("r2", "", 1, 0, keys, 10)
	now = now.Add(31 * time.Second)
	tr.Sweep()
	if n, _ := tr.Load(1, 0); n != 0 || tr.InFlight() != 0 || release("r2") {
		t.Fatal("expired flight not swept")
	}
}

// A worker id reused under a new generation starts with no in-flight load
// and no speculative blocks; releasing the old worker's requests leaves
// the new worker's load alone.
func TestTrackerGenerations(t *testing.T) {
	tr := NewTracker(TrackerOptions{SpecTTL: time.Minute, FlightTTL: time.Minute})
	keys := []indexer.Key{7, 8, 9}
	if err := tr.Record("old", "", 2, 0, keys, 100); err != nil {
		t.Fatal(err)
	}
	if n, tok := tr.Load(2, 1); n != 0 || tok != 0 {
		t.Fatalf("generation 1 sees generation 0's load: %d requests, %d tokens", n, tok)
	}
	if err := tr.Record("new", "", 2, 1, nil, 30); err != nil {
		t.Fatal(err)
	}
	if ok, err := tr.Release("old", ""); !ok || err != nil {
		t.Fatal("release of the old generation's request failed")
	}
	if n, tok := tr.Load(2, 1); n != 1 || tok != 30 {
		t.Fatalf("generation 1 load after the old release: %d requests, %d tokens, want 1, 30", n, tok)
	}
	for _, s := range tr.Speculative(keys, nil) {
		if s.Gen != 0 {
			t.Fatalf("speculative entry %+v has a generation that was never routed", s)
		}
	}
}

// Sweep drops only what expired, across shards, and keeps counts exact.
func TestTrackerSweepKeepsLive(t *testing.T) {
	now := time.Unix(0, 0)
	tr := NewTracker(TrackerOptions{SpecTTL: 10 * time.Second, FlightTTL: 10 * time.Second, Now: func() time.Time { return now }})
	for i := range 1000 {
		k := []indexer.Key{indexer.Key(i * 7919), indexer.Key(i)}
		if err := tr.Record("early-"+strconv.Itoa(i), "", indexer.WorkerID(i%5), 0, k, 1); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(5 * time.Second)
	for i := range 500 {
		k := []indexer.Key{indexer.Key(i * 7919), indexer.Key(i)}
		if err := tr.Record("late-"+strconv.Itoa(i), "", indexer.WorkerID(i%5), 0, k, 2); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(6 * time.Second) // the early ones expired
	tr.Sweep()
	if n := tr.InFlight(); n != 500 {
		t.Fatalf("in flight after sweep: %d, want 500", n)
	}
	var reqs, toks uint64
	for w := range 5 {
		n, tok := tr.Load(indexer.WorkerID(w), 0)
		reqs += uint64(n)
		toks += tok
	}
	if reqs != 500 || toks != 1000 {
		t.Fatalf("loads after sweep: %d requests, %d tokens, want 500, 1000", reqs, toks)
	}
	for i := range 1000 {
		got := tr.Speculative([]indexer.Key{indexer.Key(i * 7919), indexer.Key(i)}, nil)
		if want := i < 500; (len(got) == 1) != want {
			t.Fatalf("prompt %d: speculative %v, want present=%v", i, got, want)
		}
	}
}

// The in-flight table and the speculative keys are bounded; what the
// bounds turn away is refused (or recorded without speculation) and
// counted, and a request is released only by the client that routed it.
func TestTrackerBoundsAndOwners(t *testing.T) {
	tr := NewTracker(TrackerOptions{MaxFlights: 3, MaxSpecKeys: 5})
	for i := range 3 {
		if err := tr.Record("r"+strconv.Itoa(i), "alice", 0, 0, []indexer.Key{indexer.Key(100 + i), 2}, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Record("r3", "alice", 0, 0, nil, 1); !errors.Is(err, ErrTooManyFlights) || tr.Refused() != 1 || tr.InFlight() != 3 {
		t.Fatalf("fourth flight: %v, refused %d, in flight %d", err, tr.Refused(), tr.InFlight())
	}
	// 6 keys were offered to a bound of 5: the third route had none.
	if tr.SpecSkipped() != 1 || len(tr.Speculative([]indexer.Key{102, 2}, nil)) != 0 || len(tr.Speculative([]indexer.Key{101, 2}, nil)) != 1 {
		t.Fatalf("speculative bound: skipped %d", tr.SpecSkipped())
	}
	if ok, err := tr.Release("r0", "mallory"); ok || !errors.Is(err, ErrNotOwner) {
		t.Fatalf("release by another client: %v, %v", ok, err)
	}
	if ok, err := tr.Release("r0", "alice"); !ok || err != nil {
		t.Fatalf("release by its owner: %v, %v", ok, err)
	}
	if err := tr.Record("r3", "alice", 0, 0, nil, 1); err != nil {
		t.Fatalf("after a release there is room: %v", err)
	}
}

// Release ends a request's speculative blocks, once no other request in
// flight routed the same prompt there: its prefill is done, so its blocks
// were announced, and the index alone says whether the engine still holds
// them. A release of a request whose entry expired and was routed anew
// leaves the new entry alone; the key bound is given back.
func TestTrackerReleaseEndsSpeculation(t *testing.T) {
	now := time.Unix(1000, 0)
	tr := NewTracker(TrackerOptions{SpecTTL: 5 * time.Second, FlightTTL: time.Minute, MaxSpecKeys: 10, Now: func() time.Time { return now }})
	keys := []indexer.Key{1, 2, 3, 4}
	on := func(w indexer.WorkerID) int {
		for _, s := range tr.Speculative(keys, nil) {
			if s.Worker == w {
				return s.Blocks
			}
		}
		return 0
	}
	release := func(id string) {
		t.Helper()
		if ok, err := tr.Release(id, ""); !ok || err != nil {
			t.Fatalf("release %s: %v, %v", id, ok, err)
		}
	}
	for _, id := range []string{"a", "b"} {
		if err := tr.Record(id, "", 1, 0, keys, 10); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Record("c", "", 2, 0, keys[:2], 10); err != nil {
		t.Fatal(err)
	}
	release("a")
	if on(1) != 4 || on(2) != 2 {
		t.Fatalf("after releasing one of two routes to worker 1: speculative %d and %d blocks, want 4 and 2", on(1), on(2))
	}
	release("b")
	release("c")
	if on(1) != 0 || on(2) != 0 {
		t.Fatalf("after every release: speculative %d and %d blocks, want none", on(1), on(2))
	}
	// All 10 keys are free again: a route of 10 keys keeps its speculation.
	long := []indexer.Key{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if err := tr.Record("d", "", 1, 0, long, 10); err != nil || tr.SpecSkipped() != 0 || on(1) != 4 {
		t.Fatalf("after releases the key bound is free: %v, skipped %d, speculative %d", err, tr.SpecSkipped(), on(1))
	}
	now = now.Add(6 * time.Second) // d's entry expired; e routes anew
	if err := tr.Record("e", "", 1, 0, keys, 10); err != nil {
		t.Fatal(err)
	}
	release("d")
	if on(1) != 4 {
		t.Fatalf("an expired route's release dropped the new one: speculative %d, want 4", on(1))
	}
	release("e")
	if on(1) != 0 {
		t.Fatalf("after e's release: speculative %d", on(1))
	}
}
