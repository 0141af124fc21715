package demoload

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/internal/lograte"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/sim/workload"
	"github.com/kvindex/kvindex/tokenize"
	"github.com/kvindex/kvindex/tokenize/standin"
)

// Config sets up a load run.
type Config struct {
	Model string // the model requests name
	// Engines maps each pod name kvindex answers with to its engine's
	// OpenAI base URL, e.g. engine-0 -> http://engine-0:8000.
	Engines map[string]string
	Rate    float64 // mean arrivals per second (default 4)
	// Prefixes is the number of distinct system prompts (default 12), of
	// Zipf popularity exponent Zipf (default 1.1).
	Prefixes     int
	Zipf         float64
	SystemTokens int           // a system prompt's length (default 1,024)
	Duration     time.Duration // ends the run (0: until ctx is done)
	Seed         uint64        // of arrivals and choices
	Logger       *slog.Logger  // receives a summary every 10 s
}

// A question's tokens, a request's max_tokens, the requests in flight.
const (
	questionTokens = 48
	maxTokens      = 16
	concurrency    = 64
)

// Stats are a run's counters.
type Stats struct {
	// Sent counts requests answered by an engine; Failed those that
	// failed; Dropped those due while Concurrency were in flight.
	Sent, Failed, Dropped atomic.Int64
	// Routed counts requests kvindex routed; Fallback those sent
	// round-robin because kvindex could not answer.
	Routed, Fallback atomic.Int64
	// PromptTokens and CachedTokens sum the engines' usage answers.
	PromptTokens, CachedTokens atomic.Int64
}

// HitRate is the fraction of prompt tokens the engines had cached.
func (s *Stats) HitRate() float64 {
	p := s.PromptTokens.Load()
	if p == 0 {
		return 0
	}
	return float64(s.CachedTokens.Load()) / float64(p)
}

// Driver sends the load.
type Driver struct {
	cfg    Config
	kvs    []*api.Client // kvindex replicas, asked in turn
	http   *http.Client
	pods   []string // sorted, for the fallback
	rr     atomic.Uint64
	logMu  sync.Mutex
	logFb  lograte.Limiter // route failures: one line a minute
	next   atomic.Uint64   // request ids
	zipf   workload.Zipf   // over the prefixes
	system []string        // the system prompts
	stats  Stats
}

// New returns a driver that routes through the kvindex replicas kvs, in
// turn (a request is released on the replica that routed it).
func New(cfg Config, kvs ...*api.Client) (*Driver, error) {
	if cfg.Model == "" || len(cfg.Engines) == 0 {
		return nil, errors.New("demoload: a model and at least one engine are required")
	}
	if len(kvs) == 0 {
		return nil, errors.New("demoload: at least one kvindex client is required")
	}
	if cfg.Prefixes <= 0 {
		cfg.Prefixes = 12
	}
	if cfg.SystemTokens <= 0 {
		cfg.SystemTokens = 1024
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 4
	}
	if cfg.Zipf <= 0 {
		cfg.Zipf = 1.1
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	d := &Driver{cfg: cfg, kvs: kvs, http: &http.Client{Timeout: time.Minute}, pods: slices.Sorted(maps.Keys(cfg.Engines))}
	d.zipf = workload.ZipfCDF(cfg.Prefixes, cfg.Zipf)
	for k := range cfg.Prefixes {
		d.system = append(d.system, text(fmt.Sprintf("system prompt %d", k), cfg.SystemTokens))
	}
	return d, nil
}

// text is deterministic prose of about n simulated tokens.
func text(seed string, n int) string {
	words := []string{"cache", "prefix", "block", "router", "engine", "token", "index", "fleet"}
	var b strings.Builder
	b.WriteString(seed)
	r := rand.New(rand.NewPCG(uint64(len(seed)), uint64(seed[len(seed)-1])))
	for b.Len() < n*4 {
		b.WriteByte(' ')
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()[:n*4]
}

// Stats are the run's counters so far.
func (d *Driver) Stats() *Stats { return &d.stats }

// Run sends requests until ctx is done or Duration passed, then waits for
// those in flight (which ctx ending cancels, Duration does not).
func (d *Driver) Run(ctx context.Context) error {
	arrivals := ctx
	if d.cfg.Duration > 0 {
		var cancel context.CancelFunc
		arrivals, cancel = context.WithTimeout(ctx, d.cfg.Duration)
		defer cancel()
	}
	r := rand.New(rand.NewPCG(d.cfg.Seed, 0x6c6f6164))
	slots := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	report := time.NewTicker(10 * time.Second)
	defer report.Stop()
	next := time.Now()
	for {
		next = next.Add(time.Duration(r.ExpFloat64() / d.cfg.Rate * float64(time.Second)))
		wait := time.NewTimer(time.Until(next))
	sleep:
		for {
			select {
			case <-arrivals.Done():
				wait.Stop()
				return nil
			case <-report.C:
				d.cfg.Logger.Info("load", "sent", d.stats.Sent.Load(), "failed", d.stats.Failed.Load(), "dropped", d.stats.Dropped.Load(),
					"routed", d.stats.Routed.Load(), "fallback", d.stats.Fallback.Load(), "hit_rate", fmt.Sprintf("%.3f", d.stats.HitRate()))
			case <-wait.C:
				break sleep
			}
		}
		prefix := d.zipf.Pick(r)
		question := text(fmt.Sprintf("question %d", r.Uint64()), questionTokens)
		select {
		case slots <- struct{}{}:
		default:
			d.stats.Dropped.Add(1)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if err := d.One(ctx, prefix, question); err != nil && ctx.Err() == nil {
				d.stats.Failed.Add(1)
				d.cfg.Logger.Warn("request failed", "err", err)
			}
		}()
	}
}

// One sends one chat of system prompt prefix and question: routed by
// kvindex (or round-robin when it cannot answer), then released.
func (d *Driver) One(ctx context.Context, prefix int, question string) error {
	msgs := []tokenize.Message{{Role: "system", Content: d.system[prefix]}, {Role: "user", Content: question}}
	n := d.next.Add(1)
	id := fmt.Sprintf("load-%d", n)
	kv := d.kvs[int(n%uint64(len(d.kvs)))]
	pod, routed := d.route(ctx, kv, id, standin.Chat(msgs, true))
	if routed {
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_, _ = kv.Release(rctx, id)
		}()
	}
	url, ok := d.cfg.Engines[pod]
	if !ok {
		return fmt.Errorf("kvindex routed %s to pod %q, which no --engine names", id, pod)
	}
	body, _ := json.Marshal(map[string]any{"model": d.cfg.Model, "messages": msgs, "max_tokens": maxTokens})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(url, "/")+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("request %s to %s: %w", id, pod, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.http.Do(req)
	if err != nil {
		return fmt.Errorf("request %s to %s: %w", id, pod, err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("request %s to %s at %s: HTTP %s", id, pod, url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return fmt.Errorf("request %s to %s: decode the answer: %w", id, pod, err)
	}
	d.stats.Sent.Add(1)
	d.stats.PromptTokens.Add(int64(out.Usage.PromptTokens))
	d.stats.CachedTokens.Add(int64(out.Usage.PromptTokensDetails.CachedTokens))
	return nil
}

// route asks kvindex for a worker; on any failure it picks round-robin.
func (d *Driver) route(ctx context.Context, kv *api.Client, id string, toks []uint32) (pod string, routed bool) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := kv.Route(rctx, &kvindexv1.RouteRequest{RequestId: id, Score: &kvindexv1.ScoreRequest{Model: d.cfg.Model, TokenIds: toks}})
	if err == nil && resp.GetChosen().GetPod() != "" {
		d.stats.Routed.Add(1)
		return resp.GetChosen().GetPod(), true
	}
	d.stats.Fallback.Add(1)
	d.logMu.Lock()
	emit, suppressed := d.logFb.Allow(time.Now(), time.Minute)
	d.logMu.Unlock()
	if emit {
		d.cfg.Logger.Warn("kvindex could not route: round-robin", "request", id, "err", err, "suppressed", suppressed)
	}
	return d.pods[int(d.rr.Add(1)-1)%len(d.pods)], false
}

// Collector exports the run's counters: kvsim_load_requests_total{result}
// (sent, failed, dropped), kvsim_load_routes_total{by} (kvindex,
// round_robin) and the prompt and cached tokens the engines reported.
func (d *Driver) Collector() prometheus.Collector { return collector{d} }

type collector struct{ d *Driver }

var (
	requestsDesc = prometheus.NewDesc("kvsim_load_requests_total", "Demo requests by result: sent (answered), failed, dropped (due while the concurrency bound was reached).", []string{"result"}, nil)
	routesDesc   = prometheus.NewDesc("kvsim_load_routes_total", "Demo requests by who chose the engine: kvindex (Route) or round_robin (kvindex could not answer).", []string{"by"}, nil)
	promptDesc   = prometheus.NewDesc("kvsim_load_prompt_tokens_total", "Prompt tokens of the answered requests.", nil, nil)
	cachedDesc   = prometheus.NewDesc("kvsim_load_cached_tokens_total", "Prompt tokens the engines had cached (usage.prompt_tokens_details.cached_tokens).", nil, nil)
)

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := &c.d.stats
	for _, r := range []struct {
		d     *prometheus.Desc
		v     *atomic.Int64
		label []string
	}{
		{requestsDesc, &s.Sent, []string{"sent"}}, {requestsDesc, &s.Failed, []string{"failed"}}, {requestsDesc, &s.Dropped, []string{"dropped"}},
		{routesDesc, &s.Routed, []string{"kvindex"}}, {routesDesc, &s.Fallback, []string{"round_robin"}},
		{promptDesc, &s.PromptTokens, nil}, {cachedDesc, &s.CachedTokens, nil},
	} {
		ch <- prometheus.MustNewConstMetric(r.d, prometheus.CounterValue, float64(r.v.Load()), r.label...)
	}
}
