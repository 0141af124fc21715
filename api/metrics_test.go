package api_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/api"
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
