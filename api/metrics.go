package api

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/scoring"
)

// numCodes is the number of canonical gRPC codes (OK through Unauthenticated).
const numCodes = int(codes.Unauthenticated) + 1

// metrics are the Server's Score metrics; a nil *metrics records nothing.
type metrics struct {
	duration   prometheus.Histogram
	requests   *prometheus.CounterVec
	byCode     [numCodes]prometheus.Counter // resolved once: no label lookup per call
	watchDrops prometheus.Counter
}

// newMetrics registers the Score metrics with reg (see register).
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		watchDrops: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_watch_dropped_events_total",
			Help: "Applied events a Watch stream dropped because its reader was slower than the events (its buffer was full).",
		})),
		duration: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvindex_score_duration_seconds",
			Help: "Time to answer a Score request inside the server (validation, hashing, matching), excluding transport.",
			// 10 us to 1 s: a 128-block Score takes tens of microseconds.
			Buckets: prometheus.ExponentialBucketsRange(10e-6, 1, 16),
		})),
		requests: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_score_requests_total",
			Help: "Score requests answered, by gRPC status code.",
		}, []string{"code"})),
	}
	for c := range m.byCode {
		m.byCode[c] = m.requests.WithLabelValues(codes.Code(c).String())
	}
	return m
}

// register registers c with reg and returns it, or the equal collector reg
// already holds; any other error panics, as prometheus.MustRegister does.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic("api: register Score metrics: " + err.Error())
}

// observe records one Score that started at start and ended with err.
func (m *metrics) observe(start time.Time, err error) {
	if m == nil {
		return
	}
	m.duration.Observe(time.Since(start).Seconds())
	code := status.Code(err)
	if int(code) < numCodes {
		m.byCode[code].Inc()
		return
	}
	m.requests.WithLabelValues(code.String()).Inc()
}

// watchDropped counts one event a Watch stream dropped.
func (m *metrics) watchDropped() {
	if m != nil {
		m.watchDrops.Inc()
	}
}

// DefaultMaxTenants is Options.MaxTenants' default.
const DefaultMaxTenants = 64

// Labels that stand for no value: no worker ranked, no tenant, and tenants
// past Options.MaxTenants.
const (
	noWorker     = "none"
	noTenant     = "none"
	otherTenants = "_other"
)

// hitMetrics count answered Score and Route requests' prompt tokens and the
// tokens the chosen worker held, per (model, worker) and (model, tenant):
// the hit ratio routing predicts, beside the engines' own.
//
// Once resolved, the hot path takes no lock and allocates nothing: workers
// by id in a copy-on-write table (rebuilt under mu), tenants in a per-model
// map under tmu's read lock. At most maxTenants tenants get their own label;
// later ones share "_other", so clients cannot grow the series without bound.
type hitMetrics struct {
	prompt, hit             *prometheus.CounterVec // {model, worker}
	tenantPrompt, tenantHit *prometheus.CounterVec // {model, tenant}
	maxTenants              int

	workers atomic.Pointer[[]*workerHits] // by indexer.WorkerID
	mu      sync.Mutex                    // guards rebuilding workers

	tmu      sync.RWMutex // guards tenants, ntenants and names
	tenants  map[*indexer.Model]map[string]*hitPair
	ntenants int // distinct tenant names labelled
	names    map[string]bool
	none     sync.Map // *indexer.Model -> *hitPair, the answers with no worker
}

// hitPair is one series pair: prompt tokens and hit tokens.
type hitPair struct{ prompt, hit prometheus.Counter }

// workerHits is a worker generation's pair, with integer counts for ListWorkers.
type workerHits struct {
	gen   uint32
	ref   events.WorkerRef
	model *indexer.Model
	hitPair
	promptTokens, hitTokens atomic.Uint64
}

// workerCounts returns the prompt and hit tokens of worker (id, gen).
func (h *hitMetrics) workerCounts(id indexer.WorkerID, gen uint32) (prompt, hit uint64) {
	if h == nil {
		return 0, 0
	}
	if ws := *h.workers.Load(); int(id) < len(ws) {
		if w := ws[id]; w != nil && w.gen == gen {
			return w.promptTokens.Load(), w.hitTokens.Load()
		}
	}
	return 0, 0
}

func newHitMetrics(reg prometheus.Registerer, maxTenants int) *hitMetrics {
	defaults.Positive(&maxTenants, DefaultMaxTenants)
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
	}
	h := &hitMetrics{
		prompt: vec("kvindex_scored_prompt_tokens_total",
			"Prompt tokens of answered Score and Route requests, by model and the worker ranked first (Route: chosen); worker=\"none\" when none was ranked.", "model", "worker"),
		hit: vec("kvindex_predicted_hit_tokens_total",
			"Tokens of answered Score and Route requests that the worker ranked first (Route: chosen) holds: the predicted cache hit. Divide by kvindex_scored_prompt_tokens_total for the predicted hit ratio.", "model", "worker"),
		tenantPrompt: vec("kvindex_tenant_scored_prompt_tokens_total",
			"Prompt tokens of answered Score and Route requests, by model and request tenant (\"none\" without one, \"_other\" past the server's tenant limit).", "model", "tenant"),
		tenantHit: vec("kvindex_tenant_predicted_hit_tokens_total",
			"Predicted hit tokens of answered Score and Route requests, by model and request tenant.", "model", "tenant"),
		maxTenants: maxTenants,
		tenants:    map[*indexer.Model]map[string]*hitPair{},
		names:      map[string]bool{},
	}
	h.workers.Store(new([]*workerHits))
	return h
}

// observe counts one answer: prompt tokens, and those the first-ranked
// worker c (nil: none) holds.
func (h *hitMetrics) observe(model *indexer.Model, c *scoring.Candidate, promptTokens int, tenant string) {
	if h == nil || promptTokens <= 0 {
		return
	}
	held := 0
	var p *hitPair
	if c == nil {
		p = h.nonePair(model)
	} else {
		held = min(c.Match.Blocks*model.BlockSize(), promptTokens)
		w := h.worker(model, c)
		w.promptTokens.Add(uint64(promptTokens))
		w.hitTokens.Add(uint64(held))
		p = &w.hitPair
	}
	p.prompt.Add(float64(promptTokens))
	p.hit.Add(float64(held))
	tp := h.tenant(model, tenant)
	tp.prompt.Add(float64(promptTokens))
	tp.hit.Add(float64(held))
}

func (h *hitMetrics) nonePair(model *indexer.Model) *hitPair {
	if p, ok := h.none.Load(model); ok {
		return p.(*hitPair)
	}
	p := &hitPair{prompt: h.prompt.WithLabelValues(model.Name, noWorker), hit: h.hit.WithLabelValues(model.Name, noWorker)}
	got, _ := h.none.LoadOrStore(model, p)
	return got.(*hitPair)
}

// worker returns c's counters, resolving them on first use.
func (h *hitMetrics) worker(model *indexer.Model, c *scoring.Candidate) *workerHits {
	id := int(c.Match.Worker)
	if ws := *h.workers.Load(); id < len(ws) {
		if w := ws[id]; w != nil && w.gen == c.Gen && w.ref == c.Ref && w.model == model {
			return w
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := *h.workers.Load()
	next := make([]*workerHits, max(len(ws), id+1))
	copy(next, ws)
	name := c.Ref.String()
	w := &workerHits{gen: c.Gen, ref: c.Ref, model: model, hitPair: hitPair{
		prompt: h.prompt.WithLabelValues(model.Name, name),
		hit:    h.hit.WithLabelValues(model.Name, name),
	}}
	next[id] = w
	h.workers.Store(&next)
	return w
}

// prune deletes the series and counters of workers that left the index (or
// whose id was reused). Cost: O(worker ids), under mu.
func (h *hitMetrics) prune(ix *indexer.Index) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := *h.workers.Load()
	var next []*workerHits
	for id, w := range ws {
		if w == nil {
			continue
		}
		if cur := ix.Worker(indexer.WorkerID(id)); cur != nil && cur.Gen() == w.gen {
			continue
		}
		if next == nil {
			next = slices.Clone(ws)
		}
		next[id] = nil
		name := w.ref.String()
		h.prompt.DeleteLabelValues(w.model.Name, name)
		h.hit.DeleteLabelValues(w.model.Name, name)
	}
	if next != nil {
		h.workers.Store(&next)
	}
}

// hitPruner prunes the worker hit series on each scrape (an unchecked
// collector of nothing), so a removed worker's are gone by the next one.
type hitPruner struct {
	h  *hitMetrics
	ix *indexer.Index
}

// Describe implements prometheus.Collector: nothing (unchecked).
func (hitPruner) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector: it prunes, and sends nothing.
func (p hitPruner) Collect(chan<- prometheus.Metric) { p.h.prune(p.ix) }

// tenant returns the tenant's counters for model (own label until maxTenants).
func (h *hitMetrics) tenant(model *indexer.Model, tenant string) *hitPair {
	if tenant == "" {
		tenant = noTenant
	}
	h.tmu.RLock()
	p := h.tenants[model][tenant]
	if p == nil && h.ntenants >= h.maxTenants && !h.names[tenant] {
		p = h.tenants[model][otherTenants]
	}
	h.tmu.RUnlock()
	if p != nil {
		return p
	}
	h.tmu.Lock()
	defer h.tmu.Unlock()
	label := tenant // the series, and its key in the map, which stays bounded
	if tenant != noTenant && !h.names[tenant] {
		if h.ntenants >= h.maxTenants {
			label = otherTenants
		} else {
			h.names[tenant] = true
			h.ntenants++
		}
	}
	byName := h.tenants[model]
	if byName == nil {
		byName = map[string]*hitPair{}
		h.tenants[model] = byName
	}
	if byName[label] == nil {
		byName[label] = &hitPair{prompt: h.tenantPrompt.WithLabelValues(model.Name, label), hit: h.tenantHit.WithLabelValues(model.Name, label)}
	}
	return byName[label]
}
