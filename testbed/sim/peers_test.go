package sim

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/router"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

func TestEvaluatePeers(t *testing.T) {
	s, ms := time.Second, time.Millisecond
	pl := withMean(row(router.PreciseLoad, 0.60, 2*s), 500*ms)
	for _, tc := range []struct {
		name    string
		rows    []CriterionRow
		won     bool
		lost    []string
		bestHit string
	}{
		{
			name:    "ahead of every peer",
			rows:    []CriterionRow{pl, withMean(row(router.LLMD, 0.5, 3*s), 600*ms), withMean(row(router.SGLang, 0.62, 4*s), time.Second)},
			won:     true,
			bestHit: router.SGLang,
		},
		{
			// 2% above a peer's p99 and mean is a tie; 95% of the best
			// peer's hit rate passes.
			name:    "at the edges",
			rows:    []CriterionRow{withMean(row(router.PreciseLoad, 0.95, 2040*ms), 510*ms), withMean(row(router.Dynamo, 1, 2*s), 500*ms)},
			won:     true,
			bestHit: router.Dynamo,
		},
		{
			name:    "beaten on p99 and hit",
			rows:    []CriterionRow{pl, withMean(row(router.AIBrix, 0.70, 1900*ms), 600*ms), row(router.LLMDPrecise, 0.5, 3*s)},
			lost:    []string{"aibrix (p99, hit)"},
			bestHit: router.AIBrix,
		},
		{
			name:    "beaten on mean only, ttft-greedy not a peer",
			rows:    []CriterionRow{pl, withMean(row(router.SGLang, 0.5, 3*s), 400*ms), withMean(row(router.TTFTGreedy, 0.9, s), 100*ms)},
			lost:    []string{"sglang (mean)"},
			bestHit: router.SGLang,
		},
	} {
		v, err := EvaluatePeers(tc.rows)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if v.Won() != tc.won || !slices.Equal(v.Lost(), tc.lost) || v.BestHitPeer != tc.bestHit {
			t.Errorf("%s: won %v, lost %v, best hit %s; want %v, %v, %s", tc.name, v.Won(), v.Lost(), v.BestHitPeer, tc.won, tc.lost, tc.bestHit)
		}
	}
	if _, err := EvaluatePeers([]CriterionRow{row(router.LLMD, 0.5, s)}); err == nil {
		t.Error("no precise+load row accepted")
	}
	v, _ := EvaluatePeers([]CriterionRow{pl, row(router.RoundRobin, 0.9, s)})
	if v.Won() || len(v.Peers) != 0 {
		t.Errorf("a cell without peers counts as won: %+v", v)
	}
	// The 5% criterion leaves the peers out.
	c, err := EvaluateCriterion([]CriterionRow{pl, row(router.SGLang, 0.9, s)})
	if err != nil || !c.Met() {
		t.Errorf("criterion with only a peer beside precise+load: %+v, %v", c, err)
	}
}

func TestWritePeerSummary(t *testing.T) {
	s := time.Second
	won, _ := EvaluatePeers([]CriterionRow{row(router.PreciseLoad, 0.6, 2*s), row(router.Dynamo, 0.5, 3*s)})
	lost, _ := EvaluatePeers([]CriterionRow{row(router.PreciseLoad, 0.6, 2*s), row(router.Dynamo, 0.5, 1*s)})
	var b strings.Builder
	if err := WritePeerSummary(&b, []GridResult{{Cell: GridCell{Name: "a"}, Peers: won}, {Cell: GridCell{Name: "b"}, Peers: lost}, {Cell: GridCell{Name: "c"}}}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"| a | 2.00s / 500ms / 60.0% | - | - | 3.00s / 750ms / 50.0% | - | - | yes |",
		"| b | 2.00s / 500ms / 60.0% | - | - | **1.00s** / **250ms** / 50.0% | - | - | **no**: dynamo (p99, mean) |",
		"in 1 of 2 cells"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

// TestPeersRun replays a small workload through every peer: each
// completes every request, and the indexed peers see kvindex agree with
// the engines.
func TestPeersRun(t *testing.T) {
	w, err := LoadWorkload(WorkloadSpec{Kind: KindPrefixes, Requests: 120, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Engines: 3, Engine: engine.Config{CacheBlocks: 2048}, Seed: 1, Routers: router.Peers}
	res, err := Simulate(context.Background(), w, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Completed != 120 || r.CachedTokens == 0 {
			t.Errorf("%s completed %d of 120, cached %d tokens", r.Router, r.Completed, r.CachedTokens)
		}
		if router.NeedsIndex(r.Router) && r.IndexProblems != 0 {
			t.Errorf("%s: %d index problems", r.Router, r.IndexProblems)
		}
	}
}

// hooked is a router that records the loop's calls to Poller and
// Finisher.
type hooked struct {
	polls    []time.Duration
	now      *time.Duration
	finished map[int]int
	next     int
}

func (h *hooked) Name() string { return "hooked" }
func (h *hooked) Route(_ context.Context, req *router.Request) (int, error) {
	h.next = (h.next + 1) % 2
	return h.next, nil
}
func (h *hooked) PrefillDone(context.Context, *workload.Request, int) error { return nil }
func (h *hooked) Note() string                                              { return "" }
func (h *hooked) PollInterval() time.Duration                               { return 50 * time.Millisecond }
func (h *hooked) Poll()                                                     { h.polls = append(h.polls, *h.now) }
func (h *hooked) Finished(req *workload.Request, _ int)                     { h.finished[req.ID]++ }

// TestLoopPollsAndFinishes: a Poller is polled every interval from 0 until
// the last arrival, and a Finisher hears of every request once.
func TestLoopPollsAndFinishes(t *testing.T) {
	w := &workload.Workload{Name: "hooks"}
	for i := range 10 {
		w.Requests = append(w.Requests, workload.Request{ID: i, Arrival: time.Duration(i) * 120 * time.Millisecond,
			Prompt: []workload.Segment{{ID: uint64(i), Len: 64}}, PromptLen: 64, OutputLen: 4})
	}
	o, err := Options{Engines: 2, Seed: 1}.withDefaults(0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := newFleet(&o, false)
	if err != nil {
		t.Fatal(err)
	}
	l := &loop{w: w, o: &o, fleet: f, rec: metrics.NewRecorder(2)}
	h := &hooked{now: &l.now, finished: map[int]int{}}
	l.router = h
	if err := l.run(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The last arrival is at 1.08 s: polls at 0, 50 ms, ..., 1.1 s.
	if len(h.polls) != 23 || h.polls[0] != 0 || h.polls[22] != 1100*time.Millisecond {
		t.Fatalf("%d polls, %v ... %v", len(h.polls), h.polls[0], h.polls[len(h.polls)-1])
	}
	for i := range 10 {
		if h.finished[i] != 1 {
			t.Fatalf("request %d finished %d times", i, h.finished[i])
		}
	}
}

// TestRunGridPeersAndResume: the grid's summary judges precise+load
// against the peers that ran, writes peers.csv, and --resume keeps the
// cells already run.
func TestRunGridPeersAndResume(t *testing.T) {
	dir := t.TempDir()
	gc := GridConfig{Workloads: []string{KindRAG}, Rates: []float64{1}, Caches: []int{2000}, Requests: 150, Dir: dir, Seed: 1,
		Options: Options{Routers: []string{router.SGLang, router.AIBrix, router.PreciseLoad}}}
	var out strings.Builder
	if err := RunGrid(context.Background(), gc, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"precise+load against the peers", "| rag-1x-2k | ", "of 1 cells"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("summary lacks %q:\n%s", want, out.String())
		}
	}
	recs, err := readColumns(filepath.Join(dir, "peers.csv"), "cell", "peer")
	if err != nil || len(recs) != 2 || recs[0][1] != router.SGLang || recs[1][1] != router.AIBrix {
		t.Fatalf("peers.csv: %v %v", recs, err)
	}
	gc.Resume = true
	out.Reset()
	if err := RunGrid(context.Background(), gc, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "kvsim grid cell rag-1x-2k: kept (--resume)") || strings.Contains(out.String(), "(virtual time)") {
		t.Fatalf("resume reran the cell:\n%s", out.String())
	}
}
