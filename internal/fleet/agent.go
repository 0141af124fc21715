package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	natsgo "github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/events"
	kvnats "github.com/kvindex/kvindex/events/nats"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/config"
	"github.com/kvindex/kvindex/internal/metrics"
)

// Version is what an agent reports as its build in its registrations.
const Version = "kvindex-agent/1"

// Agent is kvindex agent: the sidecar beside one vLLM pod. It indexes the
// pod's workers (one per DP rank) from the engine's own KV events over
// local ZeroMQ (with replay, as the daemon does), and publishes each
// batch's effects, snapshots and registrations on NATS for the replicas.
//
// # Concurrency
//
// The ZeroMQ subscriber applies each worker's batches on that worker's
// goroutine; publishing serialises with snapshot requests per worker
// inside the NATS agent. Run runs everything until its context ends.
type Agent struct {
	cfg *config.Config
	pod *config.Pod
	log *slog.Logger

	ix      *indexer.Index
	workers map[int]*indexer.Worker
	sub     *zmq.Subscriber
	nc      *natsgo.Conn
	na      *kvnats.Agent
}

// NewAgent builds the agent of cfg (validated, with ValidateAgent) and
// connects to NATS; nothing is received until Run.
func NewAgent(ctx context.Context, cfg *config.Config, nc *natsgo.Conn, log *slog.Logger) (*Agent, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pod, err := cfg.ValidateAgent()
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, pod: pod, log: log, nc: nc, workers: map[int]*indexer.Worker{}}
	// No memory budget: its evictions happen outside any batch and would
	// not reach the replicas (indexer.Worker.ApplyBatchDelta).
	a.ix = indexer.New(indexer.Config{WorkerCapacity: cfg.Index.WorkerCapacity})
	bs := config.DefaultBlockSize
	for _, m := range cfg.Models {
		if m.Name == pod.Model {
			bs = m.BlockSize
		}
	}
	model, err := a.ix.AddModel(pod.Model, bs)
	if err != nil {
		return nil, fmt.Errorf("fleet: agent: %w", err)
	}
	var eps []zmq.Endpoint
	local := map[int]kvnats.LocalWorker{}
	sinks := map[int]*agentSink{}
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
		s := &agentSink{a: a, rank: rank, w: w}
		sinks[rank] = s
		local[rank] = &localWorker{a: a, w: w}
		eps = append(eps, zmq.Endpoint{Worker: we.Worker, Address: we.Endpoint, Topic: we.Topic, ReplayEndpoint: we.ReplayEndpoint, Sink: s})
	}
	policy, err := events.ParseGapPolicy(cfg.Events.GapPolicy)
	if err != nil {
		return nil, fmt.Errorf("fleet: agent: %w", err)
	}
	if a.sub, err = zmq.NewSubscriber(zmq.SubscriberOptions{
		Logger: log, LogEvery: cfg.Log.ProblemInterval, QueueSize: cfg.Events.QueueSize, QueueBytes: cfg.Events.QueueBytes,
		MaxMessageBytes: cfg.Events.MaxMessageBytes, ReplayTimeout: cfg.Events.ReplayTimeout, ReplayConcurrency: cfg.Events.ReplayConcurrency,
		GapPolicy: policy, StaleAfterDisconnect: cfg.Events.StaleAfterDisconnect, StaleAfterSilence: cfg.Events.StaleAfterSilence,
	}, eps...); err != nil {
		return nil, fmt.Errorf("fleet: agent: %w", err)
	}
	if a.na, err = kvnats.NewAgent(ctx, nc, kvnats.AgentOptions{
		Bucket: cfg.NATS.Bucket, TTL: cfg.NATS.RegistrationTTL, Model: pod.Model, BlockSize: model.BlockSize,
		KeyScheme: model.Keying(), Pod: pod.Name, Version: Version, Logger: log,
	}, local); err != nil {
		return nil, err
	}
	return a, nil
}

// Collectors are the agent's Prometheus metrics: its index and engine
// streams (the daemon's kvindex_* families) and what it published.
func (a *Agent) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		metrics.NewCollector(a.ix, a.sub),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_agent_deltas_published_total", Help: "Deltas the agent published on NATS."},
			func() float64 { return float64(a.na.Stats().Deltas) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_agent_delta_bytes_total", Help: "Bytes of the deltas the agent published on NATS."},
			func() float64 { return float64(a.na.Stats().Bytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_agent_snapshots_served_total", Help: "Snapshots the agent served to replicas."},
			func() float64 { return float64(a.na.Stats().Snapshots) }),
	}
}

// Index is the agent's own index of its pod.
func (a *Agent) Index() *indexer.Index { return a.ix }

// Subscriber is the agent's ZeroMQ subscriber.
func (a *Agent) Subscriber() *zmq.Subscriber { return a.sub }

// NATS is the agent's NATS publisher.
func (a *Agent) NATS() *kvnats.Agent { return a.na }

// Run receives the engine's events and keeps the registrations alive until
// ctx is done.
func (a *Agent) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.na.Run(ctx)
	}()
	err := a.sub.Run(ctx)
	wg.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// agentSink feeds one worker from its engine's stream and publishes the
// effects (events.SeqSink).
type agentSink struct {
	a    *Agent
	rank int
	w    *indexer.Worker
	d    indexer.Delta
	last uint64 // the last engine seq applied
}

// ApplyBatch implements events.Sink for transports without seqs.
func (s *agentSink) ApplyBatch(b *events.Batch) error { return s.ApplyBatchAt(s.last, b) }

// ApplyBatchAt implements events.SeqSink: the batch is applied to the
// worker with its effects recorded and published as one delta.
func (s *agentSink) ApplyBatchAt(seq uint64, b *events.Batch) error {
	s.last = seq
	return s.a.na.Publish(s.rank, seq, b.Timestamp, func(dseq uint64, wire *events.Delta) error {
		s.d.Reset()
		s.d.Seq = dseq
		err := s.w.ApplyBatchDelta(b, &s.d)
		toWire(&s.d, wire)
		return err
	})
}

// Reset implements events.Sink: the clear is published like a batch.
func (s *agentSink) Reset(reason string) {
	err := s.a.na.Publish(s.rank, s.last, 0, func(dseq uint64, wire *events.Delta) error {
		s.d.Reset()
		s.d.Seq = dseq
		s.w.ResetDelta(reason, &s.d)
		toWire(&s.d, wire)
		return nil
	})
	if err != nil {
		s.a.log.Warn("publishing a reset failed; replicas resync", "worker", s.w.Info().Ref.String(), "err", err)
	}
}

// localWorker is the NATS agent's view of one worker.
type localWorker struct {
	a   *Agent
	w   *indexer.Worker
	buf []byte
}

// Snapshot implements kvnats.LocalWorker: the index's segments in its
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

// Resident implements kvnats.LocalWorker.
func (l *localWorker) Resident() int64 { return l.w.Stats().ResidentBlocks }

// Capacity implements kvnats.LocalWorker.
func (l *localWorker) Capacity() int64 { return l.w.Stats().Capacity }

// Health implements kvnats.LocalWorker: the engine stream's health as the
// agent's subscriber sees it.
func (l *localWorker) Health() (events.Health, string) {
	ref := l.w.Info().Ref
	for _, st := range l.a.sub.WorkerStats() {
		if st.Worker == ref {
			return st.Health, st.HealthReason
		}
	}
	return events.HealthUnknown, ""
}
