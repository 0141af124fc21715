package scoring

import (
	"math/rand/v2"
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
	for _, g := range []Guard{GuardStatic, GuardOff} {
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

func TestCostGuardDivertsWhenQueueOutweighsCache(t *testing.T) {
	p := DefaultPolicy()
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
	p = DefaultPolicy()
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
	for _, o := range []Override{{Name: "fastest"}, {Guard: "maybe"}, {LoadWeight: -1}, {GPUWeight: 1e9}} {
		if _, err := o.Apply(base); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

func TestTrackerSpeculativeAndLoad(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	tr := NewTracker(5*time.Second, 30*time.Second, clock)
	keys := []indexer.Key{1, 2, 3, 4, 5}
	if err := tr.Record("r1", 3, keys, 80); err != nil {
		t.Fatal(err)
	}
	if err := tr.Record("r1", 3, keys, 80); err == nil {
		t.Fatal("duplicate id accepted")
	}
	if n, tok := tr.Load(3); n != 1 || tok != 80 {
		t.Fatalf("load %d %d", n, tok)
	}
	got := map[indexer.WorkerID]int{}
	// Shares the first 3 keys (chained keys: equal at 2 means equal before).
	tr.Speculative([]indexer.Key{1, 2, 3, 9, 9, 9}, func(w indexer.WorkerID, b int) { got[w] = b })
	if got[3] != 3 || len(got) != 1 {
		t.Fatalf("speculative %v", got)
	}
	now = now.Add(6 * time.Second) // speculative entries expire first
	got = map[indexer.WorkerID]int{}
	tr.Speculative(keys, func(w indexer.WorkerID, b int) { got[w] = b })
	if len(got) != 0 {
		t.Fatalf("expired speculative still visible: %v", got)
	}
	if !tr.Release("r1") || tr.Release("r1") {
		t.Fatal("release")
	}
	if n, tok := tr.Load(3); n != 0 || tok != 0 {
		t.Fatalf("load after release %d %d", n, tok)
	}
	tr.Record("r2", 1, keys, 10)
	now = now.Add(31 * time.Second)
	tr.Sweep()
	if n, _ := tr.Load(1); n != 0 || tr.InFlight() != 0 || tr.Release("r2") {
		t.Fatal("expired flight not swept")
	}
}
