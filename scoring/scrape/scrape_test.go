package scrape

import (
	"context"
	"github.com/prometheus/client_golang/prometheus"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/scoring"
)

// vllmMetrics is an excerpt in the shape vLLM's /metrics serves, with two
// engine cores (DP ranks) and unrelated series around them.
const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.93
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.41
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.2e+06
`

func TestParseRanks(t *testing.T) {
	got, _, err := Parse(strings.NewReader(vllmMetrics), 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []scoring.Scraped{{Running: 7, Waiting: 12, KVUsage: 0.93}, {Running: 2, Waiting: 0, KVUsage: 0.41}}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("rank %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	// Without engine labels (one engine) and with v0's usage name.
	old := "vllm:num_requests_running 3\nvllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.5\n"
	got, _, err = Parse(strings.NewReader(old), 1)
	if err != nil || got[0] != (scoring.Scraped{Running: 3, Waiting: 1, KVUsage: 0.5}) {
		t.Fatalf("v0 names: %+v %v", got, err)
	}
	if _, _, err := Parse(strings.NewReader("up 1\n"), 1); err == nil || !strings.Contains(err.Error(), "none of") {
		t.Fatalf("no vLLM series: %v", err)
	}
	if _, _, err := Parse(strings.NewReader("vllm:num_requests_running{ 1\n"), 1); err == nil {
		t.Fatal("malformed text accepted")
	}
}

// TestScrapeOverHTTP scrapes a real HTTP endpoint onto a board; a scrape
// older than the board's limit is ignored, and failures are counted.
func TestScrapeOverHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(vllmMetrics))
	}))
	defer srv.Close()
	board := scoring.NewLoadBoard(200 * time.Millisecond)
	s := New([]Target{{Pod: "p", DPSize: 2, URL: srv.URL + "/metrics"}}, board, 50*time.Millisecond, nil)
	if err := s.Once(context.Background(), Target{Pod: "p", DPSize: 2, URL: srv.URL + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	got, ok := board.Cell(events.WorkerRef{Pod: "p", DPRank: 1}).Load(time.Now())
	if !ok || got.Running != 2 || got.KVUsage != 0.41 {
		t.Fatalf("rank 1: %+v %v", got, ok)
	}
	if _, ok := board.Cell(events.WorkerRef{Pod: "p", DPRank: 1}).Load(time.Now().Add(time.Second)); ok {
		t.Fatal("stale scrape used")
	}
	if err := s.Once(context.Background(), Target{Pod: "q", URL: srv.URL + "/nope"}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("404: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	bad := New([]Target{{Pod: "q", URL: srv.URL + "/nope"}}, board, 20*time.Millisecond, nil)
	done := make(chan struct{})
	go func() { bad.Run(ctx); close(done) }()
	time.Sleep(100 * time.Millisecond)
	cancel()
	<-done
	if bad.Failures() < 2 {
		t.Fatalf("failures %d", bad.Failures())
	}
}

// A metrics_url with credentials or a token in its query never shows them
// in an error (which is what gets logged), whether the server answers or
// not.
func TestScrapeErrorsRedactCredentials(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	s := New(nil, scoring.NewLoadBoard(time.Second), time.Second, nil)
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, u := range []string{
		"http://admin:hunter2@" + host + "/metrics?token=s3cr3t",
		"http://admin:hunter2@127.0.0.1:1/metrics?token=s3cr3t", // nothing listens
	} {
		err := s.Once(context.Background(), Target{Pod: "p", URL: u})
		if err == nil {
			t.Fatalf("%s: no error", u)
		}
		if msg := err.Error(); strings.Contains(msg, "hunter2") || strings.Contains(msg, "s3cr3t") || !strings.Contains(msg, "REDACTED") {
			t.Fatalf("error shows credentials: %s", msg)
		}
	}
}

// TestParsePrefixCache reads vLLM V1's prefix-cache counters per rank,
// summed over a rank's series, with and without the _total suffix.
func TestParsePrefixCache(t *testing.T) {
	text := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 1
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="a"} 100
vllm:prefix_cache_queries_total{engine="0",model_name="b"} 50
vllm:prefix_cache_queries_total{engine="1"} 10
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="a"} 60
vllm:prefix_cache_hits_total{engine="1"} 4
`
	_, got, err := Parse(strings.NewReader(text), 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []PrefixCache{{Queries: 150, Hits: 60, Known: true}, {Queries: 10, Hits: 4, Known: true}, {}}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("rank %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	_, got, err = Parse(strings.NewReader("vllm:num_requests_running 1\nvllm:prefix_cache_hits 3\n"), 1)
	if err != nil || got[0] != (PrefixCache{Hits: 3, Known: true}) {
		t.Fatalf("without _total: %+v %v", got, err)
	}
}

// TestStartAndStop: a target started later (a discovered pod) is scraped
// until its stop returns, and not after.
func TestStartAndStop(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte(vllmMetrics + "vllm:prefix_cache_queries_total{engine=\"0\"} 10\nvllm:prefix_cache_hits_total{engine=\"0\"} 4\n"))
	}))
	defer srv.Close()
	board := scoring.NewLoadBoard(time.Minute)
	s := New(nil, board, 10*time.Millisecond, nil)
	stop := s.Start(context.Background(), Target{Pod: "d", DPSize: 2, URL: srv.URL + "/metrics"})
	deadline := time.Now().Add(5 * time.Second)
	for hits.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if pc := s.prefixCache(events.WorkerRef{Pod: "d"}); pc != (PrefixCache{Queries: 10, Hits: 4, Known: true}) {
		t.Fatalf("rank 0's prefix cache while scraped: %+v", pc)
	}
	stop()
	// The pod left: its prefix-cache series go with it.
	if pc := s.prefixCache(events.WorkerRef{Pod: "d"}); pc.Known {
		t.Fatalf("rank 0's prefix cache after stop: %+v", pc)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 0 {
		t.Fatalf("after stop /metrics has %d families (%v), want none", len(mfs), err)
	}
	if got, ok := board.Cell(events.WorkerRef{Pod: "d"}).Load(time.Now()); !ok || got.Running != 7 {
		t.Fatalf("rank 0 of the started target: %+v %v", got, ok)
	}
	n := hits.Load()
	time.Sleep(50 * time.Millisecond)
	if hits.Load() != n {
		t.Fatalf("scraped %d more times after stop", hits.Load()-n)
	}
}

// prefixCache returns a worker's last scraped prefix-cache counters.
func (s *Scraper) prefixCache(ref events.WorkerRef) PrefixCache {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prefix[ref]
}
