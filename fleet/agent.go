package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/natsbus"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/internal/tick"
	"github.com/kvindex/kvindex/metrics"
)

// Version is what an agent reports as its build in its registrations.
const Version = "kvindex-agent/1"

// Agent is kvindex agent: the sidecar beside one vLLM pod. It indexes the
// pod's workers (one per DP rank) from the engine's own KV events over
// local ZeroMQ (with replay, as the daemon does), and publishes each
// batch's effects, snapshots and registrations on NATS for the replicas.
// With agent.checkpoint it writes its workers' state every
// agent.checkpoint_interval and at stop, for a new agent to restore.
//
// The ZeroMQ subscriber applies each worker's batches on that worker's
// goroutine, inside the NATS agent's Publish, under the NATS agent's lock
// of the worker; a checkpoint takes each worker's state under the same
// lock (natsbus.Agent.WithWorker), so that it is the state after exactly
// the engine seq it records.
type Agent struct {
	cfg *config.Config
	pod *config.Pod
	log *slog.Logger

	ix      *indexer.Index
	model   *indexer.Model
	workers map[int]*indexer.Worker
	sinks   map[int]*agentSink
	ranks   []int // the pod's DP ranks, ascending
	sub     *zmq.Subscriber
	nc      *nats.Conn
	na      *natsbus.Agent
	ck      *checkpointer // nil without agent.checkpoint
	lag     *metrics.Lag  // engine -> agent, kvindex_event_lag_seconds

	// partials counts workers becoming partial, by reason (see history).
	partials *prometheus.CounterVec
}

// NewAgent builds the agent of cfg (validated, with ValidateAgent),
// restores its workers from its checkpoint when it has one, and connects
// to NATS; nothing is received until Run.
func NewAgent(ctx context.Context, cfg *config.Config, nc *nats.Conn, log *slog.Logger) (*Agent, error) {
	defaults.Zero(&log, slog.New(slog.DiscardHandler))
	pod, err := cfg.ValidateAgent()
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, pod: pod, log: log, nc: nc, workers: map[int]*indexer.Worker{}, sinks: map[int]*agentSink{}, lag: metrics.NewLag(),
		partials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_agent_partial_total",
			Help: "Times a worker's state became known to lack part of its engine's history, by reason: no_checkpoint (no usable checkpoint and the engine's replay buffer does not reach back to its start), checkpoint_gap (the buffer does not reach back to the checkpoint's seq), gap (events lost beyond replay while running), checkpoint (restored from a checkpoint of a partial state).",
		}, []string{"reason"})}
	for _, r := range []string{reasonNoCheckpoint, reasonCheckpointGap, reasonGap, reasonCheckpoint} {
		a.partials.WithLabelValues(r)
	}
	// No memory budget: its evictions would not reach the replicas.
	a.ix = indexer.New(indexer.Config{WorkerCapacity: cfg.Index.WorkerCapacity})
	bs := config.DefaultBlockSize
	for _, m := range cfg.Models {
		if m.Name == pod.Model {
			bs = m.BlockSize
		}
	}
	if a.model, err = a.ix.AddModel(pod.Model, bs); err != nil {
		return nil, fmt.Errorf("fleet: agent: %w", err)
	}
	var wes []config.WorkerEndpoint
	for _, we := range cfg.Workers() {
		if we.Worker.Pod != pod.Name {
			continue
		}
		w, err := a.ix.AddWorker(indexer.WorkerInfo{Ref: we.Worker, Model: pod.Model, Endpoint: we.Endpoint})
		if err != nil {
			return nil, fmt.Errorf("fleet: agent: %w", err)
		}
		if we.CapacityBlocks > 0 {
			w.SetCapacity(we.CapacityBlocks)
		}
		rank := we.Worker.DPRank
		a.workers[rank] = w
		a.sinks[rank] = &agentSink{a: a, rank: rank, w: w}
		a.ranks = append(a.ranks, rank)
		wes = append(wes, we)
	}
	slices.Sort(a.ranks)
	if cfg.Agent.Checkpoint != "" {
		a.ck = &checkpointer{path: cfg.Agent.Checkpoint, log: log, started: time.Now(),
			loads: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "kvindex_agent_checkpoint_loads_total",
				Help: "Checkpoint files read at start, by result: restored, missing, unreadable, corrupt (not a checkpoint, truncated, damaged or inconsistent: ignored), foreign (another pod, model, key scheme, block size or version: ignored).",
			}, []string{"result"})}
		for _, r := range []string{loadRestored, loadMissing, loadUnreadable, loadCorrupt, loadForeign} {
			a.ck.loads.WithLabelValues(r)
		}
		a.restore()
	}
	var eps []zmq.Endpoint
	local := map[int]natsbus.LocalWorker{}
	for _, we := range wes {
		rank := we.Worker.DPRank
		s := a.sinks[rank]
		local[rank] = &localWorker{a: a, w: s.w, s: s}
		ep := zmq.Endpoint{Worker: we.Worker, Address: we.Endpoint, Topic: we.Topic, ReplayEndpoint: we.ReplayEndpoint, Sink: s}
		if h := s.history(); h.hasSeq { // restored: replay from the checkpoint's seq
			ep.Resume, ep.ResumeAfter = true, h.seq
		}
		eps = append(eps, ep)
	}
	opts, err := SubscriberOptions(cfg, log, a.lag)
	if err != nil {
		return nil, fmt.Errorf("fleet: agent: %w", err)
	}
	if a.sub, err = zmq.NewSubscriber(opts, eps...); err != nil {
		return nil, fmt.Errorf("fleet: agent: %w", err)
	}
	if a.na, err = natsbus.NewAgent(ctx, nc, natsbus.AgentOptions{
		Bucket: cfg.NATS.Bucket, TTL: cfg.NATS.RegistrationTTL, Model: pod.Model, BlockSize: a.model.ConfiguredBlockSize(),
		KeyScheme: a.model.Keying(), Pod: pod.Name, Version: Version, Logger: log,
	}, local); err != nil {
		return nil, err
	}
	for _, rank := range a.ranks {
		a.sinks[rank].tell()
	}
	return a, nil
}

// SubscriberOptions are the ZeroMQ subscriber's options from cfg's events,
// log and medium-table (scoring.tier_names, unknown_tier) settings, with
// engine-to-kvindex lag observed into lag.
func SubscriberOptions(cfg *config.Config, log *slog.Logger, lag *metrics.Lag) (zmq.SubscriberOptions, error) {
	policy, err := events.ParseGapPolicy(cfg.Events.GapPolicy)
	if err != nil {
		return zmq.SubscriberOptions{}, err
	}
	tiers, err := cfg.Tiers()
	if err != nil {
		return zmq.SubscriberOptions{}, err
	}
	return zmq.SubscriberOptions{
		Tiers:  tiers,
		Logger: log, LogEvery: cfg.Log.ProblemInterval, QueueSize: cfg.Events.QueueSize, QueueBytes: cfg.Events.QueueBytes,
		MaxMessageBytes: cfg.Events.MaxMessageBytes, ReplayTimeout: cfg.Events.ReplayTimeout, ReplayConcurrency: cfg.Events.ReplayConcurrency,
		GapPolicy: policy, StaleAfterDisconnect: cfg.Events.StaleAfterDisconnect, StaleAfterSilence: cfg.Events.StaleAfterSilence,
		Applied: func(_ events.WorkerRef, b *events.Batch, replayed bool) {
			if !replayed {
				lag.Observe(metrics.LagZMQ, b.Timestamp, time.Now())
			}
		},
	}, nil
}

// Collectors are the agent's Prometheus metrics: its index and engine
// streams (the daemon's kvindex_* families), what it published, its
// partial workers and, with a checkpoint, its checkpoint's writes and
// restores.
func (a *Agent) Collectors() []prometheus.Collector {
	cs := []prometheus.Collector{
		metrics.NewCollector(a.ix, a.sub),
		a.lag.Collector(),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_agent_deltas_published_total", Help: "Deltas the agent published on NATS."},
			func() float64 { return float64(a.na.Stats().Deltas) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_agent_delta_bytes_total", Help: "Bytes of the deltas the agent published on NATS."},
			func() float64 { return float64(a.na.Stats().Bytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_agent_snapshots_served_total", Help: "Snapshots the agent served to replicas."},
			func() float64 { return float64(a.na.Stats().Snapshots) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvindex_agent_partial_workers", Help: "Workers whose state is known to lack part of their engine's history (registered partial; whole again after the engine clears or restarts)."},
			func() float64 { return float64(a.PartialWorkers()) }),
		a.partials,
	}
	if a.ck != nil {
		cs = append(cs, a.ck.collectors()...)
	}
	return cs
}

// LagCollector is the agent's kvindex_event_lag_seconds alone (also in
// Collectors): how late its engine's batches reach it.
func (a *Agent) LagCollector() prometheus.Collector { return a.lag.Collector() }

// Index is the agent's own index of its pod.
func (a *Agent) Index() *indexer.Index { return a.ix }

// Subscriber is the agent's ZeroMQ subscriber.
func (a *Agent) Subscriber() *zmq.Subscriber { return a.sub }

// NATS is the agent's NATS publisher.
func (a *Agent) NATS() *natsbus.Agent { return a.na }

// PartialWorkers returns how many of the agent's workers are partial now.
func (a *Agent) PartialWorkers() int {
	n := 0
	for _, s := range a.sinks {
		if s.history().partial {
			n++
		}
	}
	return n
}

// Partial reports whether worker rank is partial now, and why.
func (a *Agent) Partial(rank int) (bool, string) {
	s := a.sinks[rank]
	if s == nil {
		return false, ""
	}
	h := s.history()
	return h.partial, h.why
}

// Run receives the engine's events, keeps the registrations alive and,
// with a checkpoint, writes it every interval, until ctx is done or the
// subscriber fails; then it writes the checkpoint a last time.
func (a *Agent) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { a.na.Run(ctx) })
	if a.ck != nil {
		interval := a.cfg.Agent.CheckpointInterval
		defaults.Positive(&interval, config.DefaultCheckpointInterval) // for a config built without SetDefaults
		wg.Go(func() {
			tick.Every(ctx, interval, func(time.Time) {
				if err := a.WriteCheckpoint(); err != nil {
					a.ck.problem("writing the checkpoint failed; retrying at the next interval", err)
				}
			})
		})
	}
	err := a.sub.Run(ctx)
	cancel() // a failed subscriber stops the rest
	wg.Wait()
	if a.ck != nil { // the streams have stopped: the state after the last batch
		if cerr := a.WriteCheckpoint(); cerr != nil {
			a.log.Warn("the checkpoint at shutdown failed; a restarted agent recovers from the last one written", "path", a.ck.path, "err", cerr)
		}
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// Reasons a worker becomes partial, the label values of
// kvindex_agent_partial_total.
const (
	reasonNoCheckpoint  = "no_checkpoint"
	reasonCheckpointGap = "checkpoint_gap"
	reasonGap           = "gap"
	reasonCheckpoint    = "checkpoint"
)

// history relates a worker's state to its engine's history: the last
// engine seq the state includes, and whether it lacks part of it (partial).
//
// # Invariants
//
// The state is whole when every batch since an origin was applied in
// sequence. Origins: the engine's seq 0 on an empty worker, an
// AllBlocksCleared, a whole checkpoint restored at its seq. Any other
// batch that is not the next seq means batches were lost beyond replay:
// partial until the next origin. A Reset (engine restart, gap policy)
// empties the worker and clears hasSeq, so only seq 0 makes it whole.
// An engine that restarted while the agent was down and has passed the
// checkpoint's seq looks like the same engine: vLLM's events name no
// process.
type history struct {
	seq      uint64
	hasSeq   bool // false: nothing applied since start or the last Reset
	known    bool // a seq was ever had (checkpoint or batch)
	restored bool // restored from a checkpoint, no batch applied since
	partial  bool
	why      string // why partial, for operators
}

// batch advances h past batch seq applied to the worker, and returns the
// reason label when it made the state partial ("" otherwise).
func (h *history) batch(seq uint64, b *events.Batch) string {
	became := ""
	switch {
	case h.hasSeq && seq == h.seq+1: // in sequence
	case !h.hasSeq && seq == 0: // the engine's first batch: an origin
		h.partial, h.why = false, ""
	default:
		reason, why := reasonGap, ""
		switch {
		case !h.known:
			reason = reasonNoCheckpoint
			why = fmt.Sprintf("the engine's batches 0..%d are beyond its replay buffer, and no checkpoint covers them", seq-1)
		case h.restored && seq > h.seq+1:
			reason = reasonCheckpointGap
			why = fmt.Sprintf("the engine's batches %d..%d, after the checkpoint's seq %d, are beyond its replay buffer", h.seq+1, seq-1, h.seq)
		case h.restored:
			reason = reasonCheckpointGap
			why = fmt.Sprintf("the engine restarted after the checkpoint (at seq %d), and its replay buffer starts at seq %d", h.seq, seq)
		case seq > h.seq+1:
			why = fmt.Sprintf("the engine's batches %d..%d were lost beyond its replay buffer", h.seq+1, seq-1)
		default:
			why = fmt.Sprintf("the engine restarted, and its replay buffer starts at seq %d", seq)
		}
		if !h.partial {
			became = reason
		}
		h.partial, h.why = true, why
	}
	for i := range b.Events {
		if b.Events[i].Kind == events.KindAllBlocksCleared { // an origin
			h.partial, h.why, became = false, "", ""
		}
	}
	h.seq, h.hasSeq, h.known, h.restored = seq, true, true, false
	return became
}

// agentSink feeds one worker from its engine's stream and publishes the
// effects (events.SeqSink).
type agentSink struct {
	a    *Agent
	rank int
	w    *indexer.Worker
	d    indexer.Delta
	last uint64 // the last engine seq applied; the stream's goroutine only
	told bool   // what the NATS agent was last told (SetPartial); the stream's goroutine, or NewAgent before it

	// mu guards hist; taken inside the NATS agent's worker lock, so hist
	// changes with the state; nothing is locked under it.
	mu   sync.Mutex
	hist history
}

func (s *agentSink) history() history {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hist
}

// ApplyBatch implements events.Sink for transports without seqs.
func (s *agentSink) ApplyBatch(b *events.Batch) error { return s.ApplyBatchAt(s.last, b) }

// ApplyBatchAt implements events.SeqSink: the batch is applied to the
// worker with its effects recorded and published as one delta, and the
// worker's history advanced with it.
func (s *agentSink) ApplyBatchAt(seq uint64, b *events.Batch) error {
	s.last = seq
	became := ""
	err := s.a.na.Publish(s.rank, seq, b.Timestamp, func(dseq uint64, wire *events.Delta) error {
		s.d.Reset()
		s.d.Seq = dseq
		err := s.w.ApplyBatchDelta(b, &s.d)
		ToWire(&s.d, wire)
		s.mu.Lock()
		became = s.hist.batch(seq, b)
		s.mu.Unlock()
		return err
	})
	if became != "" {
		s.a.partials.WithLabelValues(became).Inc()
	}
	s.tell()
	return err
}

// Reset implements events.Sink: the clear is published like a batch.
func (s *agentSink) Reset(reason string) {
	err := s.a.na.Publish(s.rank, s.last, 0, func(dseq uint64, wire *events.Delta) error {
		s.d.Reset()
		s.d.Seq = dseq
		s.w.ResetDelta(reason, &s.d)
		ToWire(&s.d, wire)
		s.mu.Lock()
		s.hist.hasSeq = false
		s.mu.Unlock()
		return nil
	})
	if err != nil {
		s.a.log.Warn("publishing a reset failed; replicas resync", "worker", s.w.Info().Ref.String(), "err", err)
	}
}

// tell passes a change of the partial flag to the NATS agent's
// registration and logs it. Stream goroutine only, outside the agent lock.
func (s *agentSink) tell() {
	h := s.history()
	if h.partial == s.told {
		return
	}
	s.told = h.partial
	s.a.na.SetPartial(s.rank, h.partial)
	ref := s.w.Info().Ref.String()
	if h.partial {
		s.a.log.Warn("worker state incomplete: registered partial until the engine clears or restarts", "worker", ref, "why", h.why)
	} else {
		s.a.log.Info("worker state whole again: the engine cleared or restarted", "worker", ref, "seq", h.seq)
	}
}

// localWorker is the NATS agent's view of one worker.
type localWorker struct {
	a   *Agent
	w   *indexer.Worker
	s   *agentSink
	buf []byte
}

// Snapshot implements natsbus.LocalWorker: the index's segments in its
// binary encoding.
func (l *localWorker) Snapshot(emit func([]byte) error) (uint64, error) {
	blocks := uint64(max(l.w.Stats().ResidentBlocks, 0))
	err := l.w.Snapshot(func(s *indexer.SnapshotSegment) error {
		var err error
		if l.buf, err = s.AppendBinary(l.buf[:0]); err != nil {
			return err
		}
		return emit(l.buf)
	})
	return blocks, err
}

// Resident implements natsbus.LocalWorker.
func (l *localWorker) Resident() int64 { return l.w.Stats().ResidentBlocks }

// Capacity implements natsbus.LocalWorker.
func (l *localWorker) Capacity() int64 { return l.w.Stats().Capacity }

// Health implements natsbus.LocalWorker: the stream's health, at best
// UNSYNCED while the worker is partial.
func (l *localWorker) Health() (events.Health, string) {
	ref := l.w.Info().Ref
	h, reason := events.HealthUnknown, ""
	for _, st := range l.a.sub.WorkerStats() {
		if st.Worker == ref {
			h, reason = st.Health, st.HealthReason
		}
	}
	if hist := l.s.history(); hist.partial {
		switch h {
		case events.HealthOK, events.HealthUnknown:
			h, reason = events.HealthUnsynced, hist.why
		default:
			reason += "; " + hist.why
		}
	}
	return h, reason
}
