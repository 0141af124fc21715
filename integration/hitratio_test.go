package integration

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/config"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// labelled returns the value of the series name{labels} in a /metrics
// text (labels as the text writes them, sorted by name), or -1.
func labelled(text, series string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			return f
		}
	}
	return -1
}

// TestPredictedHitRatio: answered Score and Route requests count their
// prompt tokens and the tokens the first-ranked (chosen) worker holds,
// per worker and per tenant (past the tenant limit under "_other"),
// beside the engines' own prefix-cache counters scraped from vLLM's
// /metrics.
func TestPredictedHitRatio(t *testing.T) {
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0\n")
		fmt.Fprintf(w, "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 1000\n")
		fmt.Fprintf(w, "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 750\n")
	}))
	defer metrics.Close()
	f := newFleet(t, fleetOptions{configure: func(c *config.Config) { c.Scoring.ScrapeInterval = 50 * time.Millisecond }},
		podSpec{name: "a", metricsURL: metrics.URL}, podSpec{name: "b"})
	f.start()
	var eng engine
	prompt := tokens("hit ratio", 8*blockSize)
	ev, _ := eng.store(0, prompt[:6*blockSize])
	f.publish("a", 0, ev)

	// a holds 6 of 8 blocks: 96 of 128 tokens predicted, twice.
	f.score(&kvindexv1.ScoreRequest{TokenIds: prompt, Tenant: "team-a"})
	if _, err := f.client.Route(t.Context(), &kvindexv1.RouteRequest{RequestId: "r1", Score: &kvindexv1.ScoreRequest{Model: model, TokenIds: prompt, Tenant: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	f.client.Release(t.Context(), "r1")
	// A prompt nobody holds: no worker ranked, no tenant.
	f.score(&kvindexv1.ScoreRequest{TokenIds: tokens("cold", 4*blockSize)})

	f.waitFor(func() bool {
		return labelled(f.metrics(), `kvindex_engine_prefix_cache_hits_total{worker="a/0"}`) == 750
	}, "the engine's prefix-cache counters to be scraped")
	m := f.metrics()
	for series, want := range map[string]float64{
		`kvindex_scored_prompt_tokens_total{model="test/model",worker="a/0"}`:           256,
		`kvindex_predicted_hit_tokens_total{model="test/model",worker="a/0"}`:           192,
		`kvindex_scored_prompt_tokens_total{model="test/model",worker="none"}`:          64,
		`kvindex_predicted_hit_tokens_total{model="test/model",worker="none"}`:          0,
		`kvindex_tenant_scored_prompt_tokens_total{model="test/model",tenant="team-a"}`: 256,
		`kvindex_tenant_predicted_hit_tokens_total{model="test/model",tenant="team-a"}`: 192,
		`kvindex_tenant_scored_prompt_tokens_total{model="test/model",tenant="none"}`:   64,
		`kvindex_engine_prefix_cache_queries_total{worker="a/0"}`:                       1000,
	} {
		if got := labelled(m, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}

	if st := f.status("a", 0); st.GetScoredPromptTokens() != 256 || st.GetPredictedHitTokens() != 192 || st.GetInflightRequests() != 0 {
		t.Errorf("ListWorkers a/0: scored %d predicted %d inflight %d, want 256 192 0", st.GetScoredPromptTokens(), st.GetPredictedHitTokens(), st.GetInflightRequests())
	}

	// Past the tenant limit (64 by default), tenants share "_other".
	for i := range 70 {
		f.score(&kvindexv1.ScoreRequest{TokenIds: prompt, Tenant: fmt.Sprintf("t%02d", i)})
	}
	m = f.metrics()
	if got := labelled(m, `kvindex_tenant_scored_prompt_tokens_total{model="test/model",tenant="_other"}`); got != 7*128 {
		t.Errorf("_other tenant prompt tokens %v, want %d (7 tenants past the limit of 64, team-a being the first)", got, 7*128)
	}
	if n := strings.Count(m, "kvindex_tenant_scored_prompt_tokens_total{"); n != 66 {
		t.Errorf("%d tenant series, want 66 (64 tenants, none, _other)", n)
	}
	// A tenant label too long for a metric is refused.
	if _, err := f.client.Score(t.Context(), &kvindexv1.ScoreRequest{Model: model, TokenIds: prompt, Tenant: strings.Repeat("x", 129)}); err == nil || !strings.Contains(err.Error(), "tenant: 129 bytes exceed the limit of 128") {
		t.Errorf("long tenant: %v", err)
	}
}
