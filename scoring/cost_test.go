package scoring

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/indexer"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestEstimateByHand(t *testing.T) {
	dm := DefaultCostModel()
	dm.PrefillTokensPerSec, dm.AttentionPairsPerSec = 16000, 0 // linear, for round numbers
	m := dm.params()
	var e Estimate
	// 10 decoding requests holding half of 400,000 tokens of KV: every
	// step costs 6 ms + 10 x 0.1 ms + 200,000 x 39 ns = 14.8 ms and holds
	// 8,182 prefill tokens. 8,000 queued tokens take one step, the
	// request's 2,000 more a second.
	l := Load{Running: 10, KVUsage: 0.5}
	pr := Prompt{AvgPromptTokens: 1000}
	m.estimate(&e, &l, 8000, 2000, 0, &pr)
	if !near(e.Wait, 0.0148+0.5) || !near(e.Prefill, 0.0148+0.125) || e.Pressure != 0 || e.Delay != 0 {
		t.Fatalf("estimate %+v, want wait 0.5148, prefill 0.1398, no pressure or delay", e)
	}
	if !near(e.TTFT(), 0.6546) || !near(e.Cost(), e.TTFT()) {
		t.Fatalf("TTFT %v cost %v", e.TTFT(), e.Cost())
	}
	// 8 requests/s over 4 workers, 4,000 uncached tokens each: rho 0.5;
	// 2/s arrive during the 0.6546 s backlog / (1 - 0.5), each 0.1398 s
	// later.
	pr = Prompt{AvgPromptTokens: 1000, ArrivalRate: 8, Workers: 4, AvgUncachedTokens: 4000}
	m.estimate(&e, &l, 8000, 2000, 0, &pr)
	if want := 0.1398 * 2 * 0.6546 / 0.5; !near(e.Delay, want) {
		t.Fatalf("delay %v, want %v", e.Delay, want)
	}
	// KV 99.9% used: 400 tokens free for the request's 2,000, 1,600 to
	// preempt or wait for: 0.1 s at the prefill rate. The queue ahead is
	// admitted as running requests finish: it does not count.
	l.KVUsage = 0.999
	m.estimate(&e, &l, 8000, 2000, 0, &Prompt{AvgPromptTokens: 1000})
	if !near(e.Pressure, 0.1) {
		t.Fatalf("pressure %v, want 0.1", e.Pressure)
	}
	l.KVUsage = 0.99
	if m.estimate(&e, &l, 8000, 2000, 0, &Prompt{AvgPromptTokens: 1000}); e.Pressure != 0 {
		t.Fatalf("pressure %v with 4,000 tokens free for 2,000", e.Pressure)
	}
	// Capacity unknown: no pressure, context from the average prompt.
	m.kv = 0
	m.estimate(&e, &l, 0, 100, 0, &Prompt{AvgPromptTokens: 1000})
	if want := 0.006 + 10*0.0001 + 10*1000*39e-9 + 100.0/16000; e.Pressure != 0 || !near(e.Prefill, want) || e.Wait != 0 {
		t.Fatalf("no capacity: %+v, want prefill %v", e, want)
	}
	// The attention term: 1,000 new tokens after 9,000 cached attend over
	// 9.5e6 pairs, 9.5 ms at 1e9 pairs/s; 4,000 queued tokens over half an
	// average prompt of 1,000 each, 2e6 pairs, 2 ms.
	m = dm.params()
	m.attn = 1e9
	m.estimate(&e, &Load{}, 4000, 1000, 9000, &Prompt{AvgPromptTokens: 1000})
	if !near(e.Wait, 0.006+0.25+0.002) || !near(e.Prefill, 1000.0/16000+0.0095) {
		t.Fatalf("attention: %+v, want wait 0.258, prefill 0.072", e)
	}
	// DefaultCostModel prefills 10,000 uncached tokens in 0.625 s alone
	// (16,000 tokens/s, attention included), 128,000 in 16 s.
	def := DefaultCostModel()
	m = def.params()
	m.overhead = 0
	for _, tc := range []struct{ n, secs float64 }{{10000, 0.6246}, {128000, 16.03}} {
		m.estimate(&e, &Load{}, 0, tc.n, 0, &Prompt{})
		if math.Abs(e.Prefill-tc.secs) > 0.01 {
			t.Errorf("default model: %v tokens in %.4f s, want %.4f", tc.n, e.Prefill, tc.secs)
		}
	}
}

// The TTFT rule spills exactly when waiting for the cached worker exceeds
// recomputing the prompt elsewhere, at low load; under load the requests
// queued behind keep it where it is cached.
func TestTTFTGuardSpillsWhenWaitExceedsRecompute(t *testing.T) {
	p := DefaultPolicy()
	p.Cost.PrefillTokensPerSec, p.Cost.AttentionPairsPerSec = 16000, 0 // linear, for round numbers
	// b recomputes 1,024 tokens in one step: 6 ms + 64 ms = 70 ms. a
	// holds them all and waits for its queue: 6 ms + queue / 16,000.
	for _, tc := range []struct {
		queue uint64
		rate  float64
		first indexer.WorkerID
	}{
		{1000, 0, 0},  // 68.5 ms < 70 ms
		{1100, 0, 1},  // 74.8 ms > 70 ms
		{1100, 40, 0}, // 20/s per worker would queue behind b's recompute
		{8000, 40, 1}, // 506 ms: even so, spill
	} {
		cs := []Candidate{cand(0, 64, 0, Load{InflightPrefillTokens: tc.queue}), cand(1, 0, 0, Load{})}
		pr := prompt64
		pr.ArrivalRate, pr.Workers, pr.AvgUncachedTokens = tc.rate, 2, 512
		p.Rank(pr, cs, names(2))
		if got := order(cs); got[0] != tc.first {
			t.Errorf("queue %d at %v/s: order %v, want %d first: %+v", tc.queue, tc.rate, got, tc.first, cs)
		}
		for i := range cs {
			if cs[i].Score != -cs[i].Est.Cost() {
				t.Errorf("score %v is not minus the cost %v", cs[i].Score, cs[i].Est.Cost())
			}
		}
	}
	// 2 decoding over 100,000 tokens of KV: 10.1 ms a step.
	cs := []Candidate{cand(0, 64, 0, Load{InflightPrefillTokens: 1000, Running: 2, KVUsage: 0.25}), cand(1, 0, 0, Load{})}
	p.Rank(prompt64, cs, names(2))
	want := "64/64 blocks cached (GPU 64); est. TTFT 72.7 ms = 72.6 ms wait (1000 queued tokens, 2 decoding) + 0.1 ms own prefill (0 tokens); + 0.0 ms delay to requests behind = cost 72.7 ms"
	if got := p.Explain(prompt64, &cs[1]); cs[1].Match.Worker != 0 || got != want {
		t.Errorf("explain:\n got %q\nwant %q", got, want)
	}
	// A waiting request of unknown size counts as the average uncached
	// prefill, not the average prompt.
	cs = []Candidate{cand(0, 0, 0, Load{Waiting: 3})}
	pr := prompt64
	pr.AvgUncachedTokens = 200
	p.Rank(pr, cs, names(1))
	if cs[0].Queue != 600 {
		t.Errorf("queue of 3 waiting = %v tokens, want 600", cs[0].Queue)
	}
}

// A full engine admits a request only as a running one finishes: with
// max_num_seqs 4, 4 running and 2 waiting (or 6 routed there), a request
// waits for 3 to finish; 10 requests/s over 2 workers finish 5/s each, so
// 0.6 s, on top of the queued prefill, however cached it is. A worker
// with a free place waits for none, and the cached request spills there
// when the slot wait exceeds its recompute.
func TestSlotWait(t *testing.T) {
	dm := DefaultCostModel()
	dm.PrefillTokensPerSec, dm.AttentionPairsPerSec, dm.MaxNumSeqs = 16000, 0, 4
	m := dm.params()
	pr := Prompt{AvgPromptTokens: 1000, ArrivalRate: 10, Workers: 2, AvgUncachedTokens: 100}
	var e, free Estimate
	for _, l := range []Load{{Running: 4, Waiting: 2}, {InflightRequests: 6}, {Running: 2, InflightRequests: 6}} {
		m.estimate(&e, &l, 0, 0, 1000, &pr)
		m.estimate(&free, &Load{Running: 2, InflightRequests: 1}, 0, 0, 1000, &pr)
		if !near(e.Wait-free.Wait, 0.6) || free.Wait != 0 {
			t.Errorf("%+v: wait %v, %v with a free place; want 0.6 s more", l, e.Wait, free.Wait)
		}
	}
	// Off without max_num_seqs or an arrival rate.
	m.seqs = 0
	if m.estimate(&e, &Load{Running: 40}, 0, 0, 1000, &pr); e.Wait != 0 {
		t.Errorf("max_num_seqs 0: wait %v", e.Wait)
	}
	m.seqs = 4
	if m.estimate(&e, &Load{Running: 40}, 0, 0, 1000, &Prompt{AvgPromptTokens: 1000}); e.Wait != 0 {
		t.Errorf("no arrival rate: wait %v", e.Wait)
	}
	// Ranked: a holds the 1,024-token prompt but is full (4 running, 1
	// waiting: 0.4 s); b recomputes it in 70 ms.
	p := DefaultPolicy()
	p.Cost = dm
	cs := []Candidate{cand(0, 64, 0, Load{Running: 4, Waiting: 1}), cand(1, 0, 0, Load{Running: 1})}
	pr64 := prompt64
	pr64.ArrivalRate, pr64.Workers, pr64.AvgUncachedTokens = 10, 2, 100
	p.Rank(pr64, cs, names(2))
	if got := order(cs); got[0] != 1 {
		t.Errorf("a full holder ranked first: %v %+v", got, cs)
	}
	// With a free place the holder keeps it.
	cs = []Candidate{cand(0, 64, 0, Load{Running: 3}), cand(1, 0, 0, Load{Running: 1})}
	p.Rank(pr64, cs, names(2))
	if got := order(cs); got[0] != 0 {
		t.Errorf("a holder with a free place lost it: %v %+v", got, cs)
	}
	if err := (&CostModel{PrefillTokensPerSec: 1, MaxBatchedTokens: 1, MaxNumSeqs: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "max_num_seqs") {
		t.Errorf("negative max_num_seqs: %v", err)
	}
}

func TestCalibrate(t *testing.T) {
	c := Calibration{
		PrefillSeconds: 11, PrefillTokens: 150000,
		ITL:          []ITLPoint{{1, 0.0061}, {11, 0.0071}, {21, 0.0081}},
		PrefillPairs: 0.94e9, // 1 s of attention out of the 11 s
		NumGPUBlocks: 30000, BlockSize: 16,
	}
	m, err := Calibrate(DefaultCostModel(), c)
	if err != nil {
		t.Fatal(err)
	}
	if m.PrefillTokensPerSec != 15000 || m.StepOverhead != 6*time.Millisecond || m.DecodePerSeq != 100*time.Microsecond ||
		m.KVCapacityTokens != 480000 || m.DecodePerContextToken != 39*time.Nanosecond || m.MaxBatchedTokens != 8192 {
		t.Fatalf("calibrated %+v", m)
	}
	if m, err := Calibrate(DefaultCostModel(), Calibration{}); err != nil || m != DefaultCostModel() {
		t.Fatalf("nothing measured: %+v %v", m, err)
	}
	for name, bad := range map[string]Calibration{
		"prefill tokens": {PrefillSeconds: 1},
		"one level":      {ITL: []ITLPoint{{4, 0.01}, {4, 0.012}}},
		"negative":       {ITL: []ITLPoint{{1, 0.02}, {10, 0.01}}},
		"block size":     {NumGPUBlocks: 10},
		"all attention":  {PrefillSeconds: 1, PrefillTokens: 10, PrefillPairs: 1e10},
	} {
		if _, err := Calibrate(DefaultCostModel(), bad); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if err := (&CostModel{}).Validate(); err == nil {
		t.Error("zero cost model validates")
	}
}

// Route's own accounting gives the TTFT rule its arrival rate and
// average uncached prefill, on the tracker's clock.
func TestScorerLearnsArrivalRate(t *testing.T) {
	f := newTestFleet(t, 4)
	now := time.Unix(1000, 0)
	s := New(f.ix, Options{Tracker: NewTracker(TrackerOptions{Now: func() time.Time { return now }})})
	r := rand.New(rand.NewPCG(3, 3))
	var res Result
	for i := range 3 {
		if _, err := s.Route("r"+strconv.Itoa(i), "", &Request{Model: f.model, Tokens: tokens(r, 4*testBS)}, nil, &res); err != nil {
			t.Fatal(err)
		}
		now = now.Add(500 * time.Millisecond)
	}
	// Gaps of 0.5 s: 2 routes a second; every prompt was 64 uncached tokens.
	if err := s.Score(&Request{Model: f.model, Tokens: tokens(r, 4*testBS)}, &res); err != nil {
		t.Fatal(err)
	}
	if pr := res.Prompt; pr.ArrivalRate != 2 || pr.AvgUncachedTokens != 64 || pr.Workers != 4 {
		t.Fatalf("prompt %+v, want 2 routes/s, 64 uncached tokens, 4 workers", pr)
	}
	// Traffic that stops stops counting: 10 s of silence is 0.1/s.
	now = now.Add(9500 * time.Millisecond)
	if err := s.Score(&Request{Model: f.model, Tokens: tokens(r, 4*testBS)}, &res); err != nil {
		t.Fatal(err)
	}
	if got := res.Prompt.ArrivalRate; !near(got, 0.1) {
		t.Fatalf("rate after 10 s of silence %v, want 0.1", got)
	}
}

func TestEvictByHand(t *testing.T) {
	dm := DefaultCostModel()
	dm.PrefillTokensPerSec, dm.KVCapacityTokens = 16000, 4096
	m := dm.params()
	pr := Prompt{BlockSize: 16, AvgPromptTokens: 2000, AvgUncachedTokens: 200} // the fleet hits 90%
	var e Estimate
	// 250 resident blocks (4,000 tokens) and 2,000 new ones in 4,096:
	// 1,904 cached tokens evicted, 90% of them hit again later: 0.1071 s.
	m.evict(&e, &Load{ResidentBlocks: 250}, 2000, &pr)
	if !near(e.Evict, 1904*0.9/16000) {
		t.Fatalf("evict %v, want %v", e.Evict, 1904*0.9/16000)
	}
	// Room for it: nothing evicted.
	if m.evict(&e, &Load{ResidentBlocks: 100}, 2000, &pr); e.Evict != 0 {
		t.Fatalf("evict %v with room to spare", e.Evict)
	}
	// Blocks in use and not cached yet take room too: 1,600 cached tokens
	// and half of 4,096 in use leave 448 for 2,000.
	if m.evict(&e, &Load{ResidentBlocks: 100, KVUsage: 0.5}, 2000, &pr); !near(e.Evict, 1552*0.9/16000) {
		t.Fatalf("evict %v, want %v", e.Evict, 1552*0.9/16000)
	}
	// A full cache evicts at most the request's own tokens.
	if m.evict(&e, &Load{ResidentBlocks: 256}, 100, &pr); !near(e.Evict, 100*0.9/16000) {
		t.Fatalf("evict %v, want the 100 own tokens' worth", e.Evict)
	}
	// Nothing known of the fleet's hits, or of the capacity: no term.
	if m.evict(&e, &Load{ResidentBlocks: 256}, 100, &Prompt{BlockSize: 16}); e.Evict != 0 {
		t.Fatalf("evict %v without route accounting", e.Evict)
	}
}

// estimate is estimateAt at the fleet's average arrivals per worker.
func (m *costParams) estimate(e *Estimate, l *Load, queue, own, cached float64, pr *Prompt) {
	var aw float64
	if pr.ArrivalRate > 0 && pr.Workers > 0 {
		aw = pr.ArrivalRate / float64(pr.Workers)
	}
	m.estimateAt(e, l, queue, own, cached, pr, aw)
}
