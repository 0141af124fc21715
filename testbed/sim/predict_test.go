package sim

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/router"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// spaced is a shared-prefix workload whose requests each finish before
// the next arrives: 4 prefixes of 200 tokens (12.5 blocks) with 50-token
// suffixes, a request every 2 s.
func spaced(t *testing.T, n int) *workload.Workload {
	t.Helper()
	w, err := workload.Prefixes(workload.PrefixesConfig{Requests: n, Prefixes: 4, PrefixTokens: 200, SuffixTokens: 50, OutputTokens: 4, QPS: 1, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := range w.Requests {
		w.Requests[i].Arrival = time.Duration(i) * 2 * time.Second
	}
	return w
}

// TestPredictionExactOnDefaultLayout: with one full-attention group and
// nothing in flight when a request is routed, kvindex's match on the
// chosen engine is the engine's hit for every request, for each router
// that asks kvindex (Score, Route, and Score ranked client-side).
func TestPredictionExactOnDefaultLayout(t *testing.T) {
	w := spaced(t, 40)
	for _, mode := range []string{router.ModeRoute, router.ModeClient} {
		o := Options{Engines: 2, Engine: engine.Config{CacheBlocks: 4096}, Seed: 1, PreciseLoadMode: mode,
			Routers: []string{router.RoundRobin, router.Precise, router.PreciseLoad}}
		res, err := Simulate(context.Background(), w, o)
		if err != nil {
			t.Fatal(err)
		}
		m := byName(t, res)
		if m[router.RoundRobin].Predicted != 0 {
			t.Errorf("round-robin predicted %d hits", m[router.RoundRobin].Predicted)
		}
		for _, n := range []string{router.Precise, router.PreciseLoad} {
			r := m[n]
			if r.Predicted != 40 || r.PredictExact != 40 || r.PredictAbsErr != 0 || r.CachedTokens == 0 || r.IndexProblems != 0 {
				t.Errorf("%s (%s): %d predicted, %d exact, error %d tokens, %d cached tokens, %d index problems",
					n, mode, r.Predicted, r.PredictExact, r.PredictAbsErr, r.CachedTokens, r.IndexProblems)
			}
		}
	}
}

// TestHybridLayoutsRun replays every preset: each completes every
// request, and the ones that ask kvindex predict every hit.
func TestHybridLayoutsRun(t *testing.T) {
	w := small(t, 60)
	for _, name := range engine.PresetNames() {
		l, err := engine.Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		o := Options{Engines: 2, Engine: engine.Config{CacheBlocks: 4096, Layout: l}, Seed: 1,
			Routers: []string{router.RoundRobin, router.Precise, router.PreciseLoad}}
		res, err := Simulate(context.Background(), w, o)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, r := range res {
			if r.Completed != 60 || (router.NeedsIndex(r.Router) && r.Predicted != r.Scheduled) {
				t.Errorf("%s %s: %d completed, %d of %d scheduled predicted", name, r.Router, r.Completed, r.Predicted, r.Scheduled)
			}
			t.Logf("%-11s %-12s hit %.3f, prediction error %.1f tokens, %.1f%% exact, %.1f%% over, %d index problems",
				name, r.Router, r.TokenHitRate(), r.PredictMAE(), 100*r.PredictExactShare(), 100*r.PredictOverShare(), r.IndexProblems)
		}
	}
}

// TestHybridEventsSurviveTheWire encodes a hybrid engine's batches as
// both of vLLM's eras do and decodes them: every group field arrives.
func TestHybridEventsSurviveTheWire(t *testing.T) {
	l, _ := engine.Preset("gpt-oss")
	e, err := engine.New(0, engine.Config{CacheBlocks: 40, Layout: l, Events: true})
	if err != nil {
		t.Fatal(err)
	}
	var batches []events.Batch
	now := time.Duration(0)
	for i := range 6 {
		r := &workload.Request{ID: i, Prompt: []workload.Segment{{ID: uint64(i % 2), Len: 200}, {ID: uint64(10 + i), Len: 40}}, PromptLen: 240, OutputLen: 2}
		if !e.Submit(r, r.AppendBlockContent(nil, 16, r.OutputSegment(0))) {
			t.Fatal("rejected")
		}
		for !e.Idle() {
			d, _ := e.StartStep(now)
			now += d
			if res := e.FinishStep(now); res.Batch != nil {
				b := *res.Batch
				b.Events = slices.Clone(b.Events)
				batches = append(batches, b)
			}
		}
	}
	kinds := map[string]int{}
	for _, opt := range []events.EncodeOptions{{Encoding: events.EncodingArray}, {Encoding: events.EncodingMap}} {
		dec := events.NewDecoder()
		for _, b := range batches {
			payload, err := events.AppendPayload(nil, &b, opt)
			if err != nil {
				t.Fatal(err)
			}
			var got events.Batch
			if err := dec.Decode(payload, &got); err != nil {
				t.Fatalf("%v: %v", opt.Encoding, err)
			}
			for i, want := range b.Events {
				g := got.Events[i]
				if g.Kind != want.Kind || !slices.Equal(g.BlockHashes, want.BlockHashes) || g.GroupIdx != want.GroupIdx || !g.HasGroupIdx ||
					g.SpecKind != want.SpecKind || g.HasSlidingWindow != want.HasSlidingWindow || g.SlidingWindow != want.SlidingWindow ||
					g.BlockSize != want.BlockSize || len(g.TokenIDs) != len(want.TokenIDs) {
					t.Fatalf("%v: event %d decoded as %+v, want %+v", opt.Encoding, i, g, want)
				}
				kinds[fmt.Sprintf("%v %d %s", want.Kind, want.GroupIdx, want.SpecKind)]++
			}
		}
	}
	for _, k := range []string{"BlockStored 0 sliding_window", "BlockStored 1 full_attention", "BlockRemoved 0 ", "BlockRemoved 1 "} {
		if kinds[k] == 0 {
			t.Errorf("no %q event in %v", k, kinds)
		}
	}
}

func TestReportShowsPrediction(t *testing.T) {
	results := []metrics.Result{
		{Router: "round-robin", IndexProblems: -1},
		{Router: "precise", Predicted: 4, PredictExact: 3, PredictOver: 1, PredictAbsErr: 64, PredictRouteErr: 16, PredictQueueErr: 48, PredictLost: 1,
			Estimated: 4, EstWithin: 3, EstTTFTSum: 2 * time.Second, EstRealSum: 3 * time.Second, EstAbsErr: time.Second,
			EstLong: 1, EstLongSum: time.Second, EstLongRealSum: 2 * time.Second},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, results, nil, ""); err != nil {
		t.Fatal(err)
	}
	want := "kvindex's predicted hit vs the engine's, per request (mean absolute; in parentheses against the engine when routed / its cache changing while the request queued): precise error 16.0 tokens (4.0 / 12.0), 75.0% exact, 25.0% over\n" +
		"kvindex's estimated TTFT on the chosen engine vs the TTFT, per request (mean estimate against mean TTFT, mean absolute error): precise 0.50s against 0.75s, error 0.25s, 75.0% within 25%; the 1 estimated at 1.00s or more took 2.00x their estimate\n"
	if !strings.HasSuffix(b.String(), want) {
		t.Errorf("table ends:\n%s\nwant %q", b.String(), want)
	}
	dir := t.TempDir()
	if err := WriteCSV(dir, results, nil); err != nil {
		t.Fatal(err)
	}
	f, err := os.ReadFile(filepath.Join(dir, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(bytes.NewReader(f)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	head, row := rows[0], rows[2]
	got := strings.Join(row[slices.Index(head, "predicted"):slices.Index(head, "estimated")], ",")
	if got != "4,16,0.75,0.25,4,12,1" {
		t.Errorf("prediction columns %q", got)
	}
	if got := strings.Join(row[slices.Index(head, "estimated"):], ","); got != "4,0.5,0.75,0.25,0.75,1,2" {
		t.Errorf("estimate columns %q", got)
	}
	// No router predicting: no line.
	b.Reset()
	if err := WriteTable(&b, results[:1], nil, ""); err != nil || strings.Contains(b.String(), "predicted") || strings.Contains(b.String(), "estimated") {
		t.Errorf("a table without predictions: %v\n%s", err, b.String())
	}
}

// TestPredictionExactWhenSerial: with nothing in flight when a request is
// routed (Options.Serial), kvindex's predicted hit on the chosen engine is
// the engine's hit for every request of every preset layout, for Score and
// Route (whose speculation must not outlive a released prefill, nor lift
// a hybrid cap), on multi-turn sessions through caches small enough that
// window and mamba blocks are evicted; every KV-cache group agrees.
func TestPredictionExactWhenSerial(t *testing.T) {
	w, err := LoadWorkload(WorkloadSpec{Kind: KindSessions, Requests: 12, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range engine.PresetNames() {
		l, err := engine.Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		o := Options{Engines: 2, Engine: engine.Config{CacheBlocks: 2048, Layout: l}, Seed: 1, Serial: true,
			Routers: []string{router.Precise, router.PreciseLoad}}
		res, err := Simulate(context.Background(), w, o)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, r := range res {
			if r.Predicted != r.Scheduled || r.PredictExact != r.Predicted || r.PredictRouteErr+r.PredictQueueErr != 0 || r.IndexProblems != 0 || r.Scheduled == 0 {
				t.Errorf("%s %s: %d of %d scheduled predicted, %d exact (%d over, error %d tokens); index: %d problems %s",
					name, r.Router, r.Predicted, r.Scheduled, r.PredictExact, r.PredictOver, r.PredictAbsErr, r.IndexProblems, r.IndexDetail)
			}
		}
	}
}

// TestPrefixOnlyVariant: a kvindex router named with PrefixOnly runs
// beside the router itself on a kvindex that matches by the prefix group
// alone: on a gpt-oss fleet whose window blocks are evicted it credits
// hits the engines do not realize, where the hybrid rule is exact. The
// variant of a router that does not ask kvindex is refused.
func TestPrefixOnlyVariant(t *testing.T) {
	w, err := LoadWorkload(WorkloadSpec{Kind: KindSessions, Requests: 12, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	l, _ := engine.Preset("gpt-oss")
	o := Options{Engines: 2, Engine: engine.Config{CacheBlocks: 2048, Layout: l}, Seed: 1, Serial: true,
		Routers: WithPrefixOnly([]string{router.RoundRobin, router.Precise})}
	if want := []string{router.RoundRobin, router.Precise, router.Precise + PrefixOnly}; !slices.Equal(o.Routers, want) {
		t.Fatalf("WithPrefixOnly: %v, want %v", o.Routers, want)
	}
	res, err := Simulate(context.Background(), w, o)
	if err != nil {
		t.Fatal(err)
	}
	m := byName(t, res)
	capped, prefix := m[router.Precise], m[router.Precise+PrefixOnly]
	if capped == nil || prefix == nil {
		t.Fatalf("results %v", slices.Collect(maps.Keys(m)))
	}
	if capped.PredictExact != capped.Predicted || prefix.PredictOver == 0 || prefix.IndexProblems != 0 {
		t.Errorf("hybrid rule %d of %d exact; prefix group alone %d over, %d index problems", capped.PredictExact, capped.Predicted, prefix.PredictOver, prefix.IndexProblems)
	}
	o.Routers = []string{router.RoundRobin + PrefixOnly}
	if _, err := Simulate(context.Background(), w, o); err == nil {
		t.Error("round-robin/prefix-only ran")
	}
}

// TestEstimateCalibratedWhenSerial: precise+load's Route gives each
// request kvindex's estimated TTFT on the chosen engine, and, with
// nothing in flight (Options.Serial) on engines the cost model describes
// (CostModel), the estimate is the TTFT to within 1%: each request
// prefills alone, as the model's step and attention terms describe.
// Routers that do not ask Route estimate nothing.
func TestEstimateCalibratedWhenSerial(t *testing.T) {
	w, err := LoadWorkload(WorkloadSpec{Kind: KindSessions, Requests: 12, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Engines: 2, Engine: engine.Config{CacheBlocks: 4096}, Seed: 1, Serial: true,
		Routers: []string{router.RoundRobin, router.Precise, router.PreciseLoad}}
	res, err := Simulate(context.Background(), w, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Router != router.PreciseLoad {
			if r.Estimated != 0 {
				t.Errorf("%s estimated %d TTFTs", r.Router, r.Estimated)
			}
			continue
		}
		if r.Estimated != r.Scheduled || r.Scheduled == 0 || r.EstMAE() > r.EstRealMean()/100 || r.EstWithinShare() != 1 {
			t.Errorf("%s: %d of %d estimated; mean %v against %v, %.1f%% within 25%%", r.Router, r.Estimated, r.Scheduled, r.EstMean(), r.EstRealMean(), 100*r.EstWithinShare())
		}
	}
}
