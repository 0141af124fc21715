package api_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

func TestScoreMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	f := serve(t, ix, nil, api.Options{Registerer: reg})
	// A second server on the same registry shares the collectors.
	_ = api.NewServer(ix, nil, api.Options{Registerer: reg})

	ctx := context.Background()
	if _, err := f.client.Score(ctx, &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 2)}); err != nil {
		t.Fatalf("Score: %v", err)
	}
	for range 2 {
		if _, err := f.client.Score(ctx, &kvindexv1.ScoreRequest{Model: "m"}); err == nil {
			t.Fatal("Score without a prompt succeeded")
		}
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	requests := map[string]float64{}
	var observed uint64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "kvindex_score_requests_total":
				requests[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			case "kvindex_score_duration_seconds":
				observed = m.GetHistogram().GetSampleCount()
			}
		}
	}
	if requests["OK"] != 1 || requests["InvalidArgument"] != 2 {
		t.Errorf("kvindex_score_requests_total = %v, want OK 1, InvalidArgument 2", requests)
	}
	if observed != 3 {
		t.Errorf("kvindex_score_duration_seconds count = %d, want 3", observed)
	}
}

// TestHitSeriesOfRemovedWorkers: a worker's predicted-hit series go when
// the worker leaves the index (by the second scrape after), and another
// worker's stay.
func TestHitSeriesOfRemovedWorkers(t *testing.T) {
	reg := prometheus.NewRegistry()
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	f := serve(t, ix, nil, api.Options{Registerer: reg})
	toks := prompt(1, 2)
	for _, pod := range []string{"a", "b"} {
		w := mustWorker(t, ix, "m", pod, 0)
		apply(t, w, stored(1, toks, 0, 2))
		if _, err := f.client.Score(t.Context(), &kvindexv1.ScoreRequest{Model: "m", TokenIds: toks, Workers: []*kvindexv1.WorkerRef{{Pod: pod}}}); err != nil {
			t.Fatalf("Score on %s: %v", pod, err)
		}
	}
	series := func() map[string]float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "kvindex_predicted_hit_tokens_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "worker" {
						out[l.GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
		}
		return out
	}
	if got := series(); got["a/0"] != float64(len(toks)) || got["b/0"] != float64(len(toks)) {
		t.Fatalf("before removal: %v, want a/0 and b/0 at %d", got, len(toks))
	}
	if err := ix.RemoveWorker(events.WorkerRef{Pod: "a"}); err != nil {
		t.Fatal(err)
	}
	series()
	got := series()
	if _, ok := got["a/0"]; ok || got["b/0"] != float64(len(toks)) {
		t.Fatalf("after a's removal: %v, want only b/0 at %d", got, len(toks))
	}
}
