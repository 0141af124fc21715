// Package scrape reads vLLM engines' Prometheus /metrics endpoints for the
// load figures kvindex's ranking uses (requests running and waiting, KV
// cache usage) and posts them on a scoring.LoadBoard. One goroutine per pod
// scrapes at a fixed interval; a failed scrape is counted and logged
// (rate-limited), and the board expires the pod's last figures.
package scrape

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/redact"
	"github.com/kvindex/kvindex/scoring"
)

// vLLM's metric names. Older releases called KV usage gpu_cache_usage_perc.
const (
	metricRunning   = "vllm:num_requests_running"
	metricWaiting   = "vllm:num_requests_waiting"
	metricKVUsage   = "vllm:kv_cache_usage_perc"
	metricKVUsageV0 = "vllm:gpu_cache_usage_perc"
	// The engine's own prefix cache counters, in tokens (vLLM V1), with or
	// without the _total suffix.
	metricPrefixQueries = "vllm:prefix_cache_queries"
	metricPrefixHits    = "vllm:prefix_cache_hits"
)

// PrefixCache is one engine's own prefix-cache counters as last scraped, in
// tokens since the engine started.
type PrefixCache struct {
	Queries, Hits float64
	Known         bool // false when the engine exports neither counter.
}

// Target is one pod's metrics endpoint.
type Target struct {
	Pod    string
	DPSize int    // the pod's data-parallel size.
	URL    string // the metrics endpoint, e.g. http://10.0.0.5:8000/metrics.
}

// Scraper scrapes targets onto a board.
type Scraper struct {
	targets  []Target
	board    *scoring.LoadBoard
	interval time.Duration
	client   *http.Client
	log      *slog.Logger

	failures atomic.Int64
	mu       sync.Mutex // guards lastErr and prefix
	lastErr  map[string]string
	prefix   map[events.WorkerRef]PrefixCache // the engines' prefix-cache counters by worker.
}

// New returns a scraper; interval 0 means 1 s.
func New(targets []Target, board *scoring.LoadBoard, interval time.Duration, log *slog.Logger) *Scraper {
	if interval <= 0 {
		interval = time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Scraper{
		targets: targets, board: board, interval: interval, log: log,
		client:  &http.Client{Timeout: interval},
		lastErr: make(map[string]string),
		prefix:  make(map[events.WorkerRef]PrefixCache),
	}
}

var (
	descPrefixQueries = prometheus.NewDesc("kvindex_engine_prefix_cache_queries_total",
		"The engine's own prefix-cache queries in tokens (vLLM's vllm:prefix_cache_queries), as last scraped, by worker (pod/rank).", []string{"worker"}, nil)
	descPrefixHits = prometheus.NewDesc("kvindex_engine_prefix_cache_hits_total",
		"The engine's own prefix-cache hits in tokens (vLLM's vllm:prefix_cache_hits), as last scraped, by worker; beside kvindex_predicted_hit_tokens_total.", []string{"worker"}, nil)
)

// Describe implements prometheus.Collector.
func (s *Scraper) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPrefixQueries
	ch <- descPrefixHits
}

// Collect implements prometheus.Collector: each engine's prefix-cache
// counters as last scraped, mirrored as counters (rate() handles resets).
func (s *Scraper) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ref, pc := range s.prefix {
		if !pc.Known {
			continue
		}
		w := ref.String()
		ch <- prometheus.MustNewConstMetric(descPrefixQueries, prometheus.CounterValue, pc.Queries, w)
		ch <- prometheus.MustNewConstMetric(descPrefixHits, prometheus.CounterValue, pc.Hits, w)
	}
}

// Failures counts failed scrapes.
func (s *Scraper) Failures() int64 { return s.failures.Load() }

// Run scrapes every target every interval until ctx is done.
func (s *Scraper) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, t := range s.targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.loop(ctx, t)
		}()
	}
	wg.Wait()
}

// Start scrapes one more target (a discovered pod) every interval until
// ctx is done or stop is called; stop returns once the scrapes ended.
func (s *Scraper) Start(ctx context.Context, t Target) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.loop(ctx, t)
	}()
	return func() {
		cancel()
		<-done
		s.forget(t.Pod)
	}
}

// forget drops what was scraped of pod, so its series leave /metrics.
func (s *Scraper) forget(pod string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ref := range s.prefix {
		if ref.Pod == pod {
			delete(s.prefix, ref)
		}
	}
	delete(s.lastErr, pod)
}

// loop scrapes t every interval until ctx is done.
func (s *Scraper) loop(ctx context.Context, t Target) {
	tick := time.NewTicker(s.interval)
	defer tick.Stop()
	for {
		if err := s.Once(ctx, t); err != nil && ctx.Err() == nil {
			s.failures.Add(1)
			s.mu.Lock()
			first := s.lastErr[t.Pod] != err.Error()
			s.lastErr[t.Pod] = err.Error()
			s.mu.Unlock()
			if first {
				s.log.Warn("scraping vLLM metrics failed; the pod's load is unknown until it recovers", "pod", t.Pod, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Once scrapes one target and posts every rank's load. Errors name the URL
// with credentials and token-bearing query values masked.
func (s *Scraper) Once(ctx context.Context, t Target) error {
	shown := redact.URL(t.URL)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", shown, redact.Err(err))
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", shown, redact.Err(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("scrape %s: HTTP %s", shown, resp.Status)
	}
	loads, prefix, err := Parse(io.LimitReader(resp.Body, 16<<20), t.DPSize)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", shown, err)
	}
	now := time.Now()
	for rank, l := range loads {
		l.At = now
		s.board.Set(events.WorkerRef{Pod: t.Pod, DPRank: rank}, l)
	}
	s.mu.Lock()
	for rank, pc := range prefix {
		s.prefix[events.WorkerRef{Pod: t.Pod, DPRank: rank}] = pc
	}
	s.mu.Unlock()
	return nil
}

// Parse reads vLLM's metrics text and returns the load and the
// prefix-cache counters per DP rank (dpSize entries). vLLM labels each
// engine core's series with engine="<rank>"; series without it belong to
// rank 0. A rank's series are summed; usage is their maximum.
func Parse(r io.Reader, dpSize int) ([]scoring.Scraped, []PrefixCache, error) {
	if dpSize < 1 {
		dpSize = 1
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, nil, fmt.Errorf("parse metrics: %w", err)
	}
	out := make([]scoring.Scraped, dpSize)
	found := false
	each := func(name string, f func(rank int, v float64)) {
		fam := fams[name]
		if fam == nil {
			return
		}
		found = true
		for _, m := range fam.GetMetric() {
			rank := 0
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "engine" {
					if n, err := strconv.Atoi(lp.GetValue()); err == nil {
						rank = n
					}
				}
			}
			if rank < 0 || rank >= dpSize {
				continue
			}
			f(rank, value(m))
		}
	}
	each(metricRunning, func(r int, v float64) { out[r].Running += uint32(max(v, 0)) })
	each(metricWaiting, func(r int, v float64) { out[r].Waiting += uint32(max(v, 0)) })
	usage := metricKVUsage
	if fams[usage] == nil {
		usage = metricKVUsageV0
	}
	each(usage, func(r int, v float64) { out[r].KVUsage = max(out[r].KVUsage, v) })
	if !found {
		return nil, nil, fmt.Errorf("parse metrics: none of %s, %s, %s present", metricRunning, metricWaiting, metricKVUsage)
	}
	prefix := make([]PrefixCache, dpSize)
	for _, suffix := range []string{"", "_total"} {
		each(metricPrefixQueries+suffix, func(r int, v float64) { prefix[r].Queries += v; prefix[r].Known = true })
		each(metricPrefixHits+suffix, func(r int, v float64) { prefix[r].Hits += v; prefix[r].Known = true })
	}
	return out, prefix, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}
