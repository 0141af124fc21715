package scoring

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// loadedFleet is BenchmarkScoreLoaded's fleet: 64 workers, 64 prompts of
// 128 blocks each held by 8 of them, and 256 other blocks per worker.
func loadedFleet(b *testing.B) (*testFleet, [][]uint32) {
	f := newTestFleet(b, 64)
	r := rand.New(rand.NewPCG(5, 5))
	prompts := make([][]uint32, 64)
	for i := range prompts {
		prompts[i] = tokens(r, 128*testBS)
		for j := range 8 {
			f.store(b, f.ws[(i+j*8)%len(f.ws)], prompts[i])
		}
	}
	for _, w := range f.ws {
		f.store(b, w, tokens(r, 256*testBS))
	}
	return f, prompts
}

// BenchmarkScoreLoaded is Scorer.Score of a 128-block prompt (token ids)
// over 64 workers, 8 of which hold it, in alternating slices: idle (no
// route in flight, no scraped load) and busy, where 1,000 routes are in
// flight (8 of them for the scored prompts, so speculative entries are
// found and merged), every worker has a fresh scrape, and a second
// goroutine rewrites every worker's scrape each millisecond, routes and
// releases 1,000 requests a second and sweeps the tracker every 10 ms.
// ratio is busy over idle mean latency; p50 is reported for both.
func BenchmarkScoreLoaded(b *testing.B) {
	f, prompts := loadedFleet(b)
	idle := New(f.ix, Options{})
	loads := NewLoadBoard(time.Hour)
	busy := New(f.ix, Options{Loads: loads, Tracker: NewTracker(TrackerOptions{SpecTTL: time.Hour, FlightTTL: time.Hour})})
	r := rand.New(rand.NewPCG(6, 6))
	var route Result
	for i := range 1000 {
		p := prompts[i%len(prompts)]
		if i >= len(prompts) {
			p = tokens(r, 32*testBS)
		}
		if _, err := busy.Route("r"+strconv.Itoa(i), "", &Request{Model: f.model, Tokens: p}, nil, &route); err != nil {
			b.Fatal(err)
		}
	}
	setLoads := func(n uint32) {
		now := time.Now()
		for _, w := range f.ws {
			loads.Set(w.Info().Ref, Scraped{Running: n % 7, Waiting: n % 3, KVUsage: 0.5, At: now})
		}
	}
	setLoads(1)
	var on, stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the live side: scrapes, route churn, sweeps
		defer wg.Done()
		var res Result
		churn := tokens(rand.New(rand.NewPCG(7, 7)), 32*testBS)
		next := 1000
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for n := uint32(0); !stop.Load(); n++ {
			<-tick.C
			if !on.Load() {
				continue
			}
			setLoads(n)
			// One route in and one out per tick keeps 1,000 in flight.
			churn[0] = uint32(next)
			if _, err := busy.Route("r"+strconv.Itoa(next), "", &Request{Model: f.model, Tokens: churn}, nil, &res); err != nil {
				panic(err)
			}
			busy.Release("r"+strconv.Itoa(next-1000+len(prompts)), "")
			next++
			if n%10 == 0 {
				busy.Tracker().Sweep()
			}
		}
	}()
	const slices_, perSlice = 40, 500
	var lat [2][]int64
	var res Result
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for sl := range slices_ {
			s := idle
			if sl%2 == 1 {
				s = busy
				on.Store(true)
				time.Sleep(2 * time.Millisecond) // let the live side start
			}
			for i := range perSlice {
				req := Request{Model: f.model, Tokens: prompts[i%len(prompts)]}
				t0 := time.Now()
				if err := s.Score(&req, &res); err != nil {
					b.Fatal(err)
				}
				lat[sl%2] = append(lat[sl%2], int64(time.Since(t0)))
			}
			on.Store(false)
		}
	}
	b.StopTimer()
	stop.Store(true)
	wg.Wait()
	if len(res.Ranked) != 8 {
		b.Fatalf("busy Score ranked %d workers, want 8", len(res.Ranked))
	}
	if res.Ranked[0].Load.Source != "scrape" {
		b.Fatalf("busy Score did not read scraped load: %+v", res.Ranked[0].Load)
	}
	mean := func(l []int64) float64 {
		var s int64
		for _, v := range l {
			s += v
		}
		return float64(s) / float64(len(l))
	}
	p50 := func(l []int64) float64 {
		slices.Sort(l)
		return float64(l[len(l)/2])
	}
	mi, mb := mean(lat[0]), mean(lat[1])
	b.ReportMetric(mi, "idle-mean-ns")
	b.ReportMetric(mb, "busy-mean-ns")
	b.ReportMetric(p50(lat[0]), "idle-p50-ns")
	b.ReportMetric(p50(lat[1]), "busy-p50-ns")
	b.ReportMetric(mb/mi, "ratio")
	runtime.KeepAlive(f)
}

// BenchmarkRankTTFT is Policy.Rank of 64 loaded candidates (random
// matches of a 128-block prompt, running, waiting, KV usage and in-flight
// load; the shared rates of all 14 sampled depths) under GuardTTFT, the default, against the token-cost guard it
// replaced (the baseline), interleaved in slices of 1,000 rankings in the
// same run. ratio is TTFT over token cost, mean ns per Rank.
func BenchmarkRankTTFT(b *testing.B) {
	const n = 64
	r := rand.New(rand.NewPCG(8, 8))
	base := make([]Candidate, n)
	for i := range base {
		base[i] = cand(i, r.IntN(129), 0, Load{Running: uint32(r.IntN(40)), Waiting: uint32(r.IntN(5)), KVUsage: r.Float64(),
			InflightRequests: uint32(r.IntN(8)), InflightPrefillTokens: uint64(r.IntN(20000))})
	}
	pr := Prompt{Blocks: 128, Tokens: 128 * testBS, BlockSize: testBS, AvgPromptTokens: 2048, AvgUncachedTokens: 900, ArrivalRate: 30, Workers: n}
	// Every depth of the prompt sampled, shared by fewer requests deeper.
	for pr.SharedDepths < MaxSharedDepths && SharedDepth(pr.SharedDepths) <= pr.Blocks {
		pr.SharedRates[pr.SharedDepths] = 30 / float64(pr.SharedDepths+1)
		pr.SharedDepths++
	}
	ttft, cost := DefaultPolicy(), DefaultPolicy()
	cost.Guard = GuardCost
	refs := names(n)
	cs := make([]Candidate, n)
	var ns [2]time.Duration
	var count [2]int
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for sl := range 20 {
			p := &cost
			if sl%2 == 1 {
				p = &ttft
			}
			t0 := time.Now()
			for range 1000 {
				copy(cs, base)
				p.Rank(pr, cs, refs)
			}
			ns[sl%2] += time.Since(t0)
			count[sl%2] += 1000
		}
	}
	b.StopTimer()
	if cs[0].Est.Cost() <= 0 {
		b.Fatalf("ttft ranking left no estimate: %+v", cs[0])
	}
	c, t := float64(ns[0])/float64(count[0]), float64(ns[1])/float64(count[1])
	b.ReportMetric(c, "cost-ns/rank")
	b.ReportMetric(t, "ttft-ns/rank")
	b.ReportMetric(t/c, "ratio")
}
