package integration

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/config"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TestScrapedLoadSteersRoute: the daemon scrapes each pod's vLLM /metrics
// (a real HTTP endpoint serving vLLM's metric names); a worker holding the
// whole prompt but with a long queue loses the request to an idle one, and
// wins it back when its queue drains. kvindexctl-style explain shows where
// the load came from.
func TestScrapedLoadSteersRoute(t *testing.T) {
	var waitingA atomic.Int64
	waitingA.Store(40)
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pod := strings.TrimPrefix(r.URL.Path, "/")
		waiting := int64(0)
		if pod == "a" {
			waiting = waitingA.Load()
		}
		fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} %d\n", waiting)
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1\n")
		fmt.Fprintf(w, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n")
	}))
	defer metrics.Close()
	f := newFleet(t, fleetOptions{configure: func(c *config.Config) { c.Scoring.ScrapeInterval = 50 * time.Millisecond }},
		podSpec{name: "a", metricsURL: metrics.URL + "/a"}, podSpec{name: "b", metricsURL: metrics.URL + "/b"})
	f.start()
	var eng engine
	prompt := tokens("long shared document", 64*blockSize)
	ev, _ := eng.store(0, prompt)
	f.publish("a", 0, ev)

	explain := func() *kvindexv1.ScoreResponse {
		return f.score(&kvindexv1.ScoreRequest{TokenIds: prompt, Explain: true, Policy: &kvindexv1.ScorePolicy{}})
	}
	f.waitFor(func() bool {
		resp := explain()
		return len(resp.GetWorkers()) == 2 && resp.GetWorkers()[0].GetLoad().GetSource() == "scrape" && resp.GetWorkers()[1].GetLoad().GetSource() == "scrape"
	}, "both pods' load to be scraped")
	resp := explain()
	if resp.GetWorkers()[0].GetWorker().GetPod() != "b" {
		t.Fatalf("a with 40 waiting should lose to idle b: %v", resp.GetWorkers())
	}
	var a *kvindexv1.WorkerScore
	for _, w := range resp.GetWorkers() {
		if w.GetWorker().GetPod() == "a" {
			a = w
		}
	}
	if a.GetLoad().GetWaiting() != 40 || a.GetLoad().GetRunning() != 1 || a.GetLoad().GetKvCacheUsage() != 0.5 || a.GetMatchedBlocks() != 64 || !strings.Contains(a.GetReason(), "64/64 blocks cached") {
		t.Fatalf("a: %v", a)
	}
	r, err := f.client.Route(t.Context(), &kvindexv1.RouteRequest{RequestId: "q1", Score: &kvindexv1.ScoreRequest{Model: model, TokenIds: prompt}})
	if err != nil || r.GetChosen().GetPod() != "b" {
		t.Fatalf("Route under load: %v %v", r.GetChosen(), err)
	}
	f.client.Release(t.Context(), "q1")
	waitingA.Store(0)
	f.waitFor(func() bool { return explain().GetWorkers()[0].GetWorker().GetPod() == "a" }, "a to win back once its queue drains")
	if !strings.Contains(f.metrics(), "kvindex_inflight_requests 0") {
		t.Fatal("/metrics: kvindex_inflight_requests not 0 after release")
	}
}
