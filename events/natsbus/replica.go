package natsbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/internal/lograte"
	"github.com/kvindex/kvindex/internal/tick"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

// KeyedSink is a replica's worker, fed keyed deltas and snapshots.
type KeyedSink interface {
	// ApplyDelta applies delta seq's entries in order; an entry that does
	// not fit the worker's state is an error (the source resyncs).
	ApplyDelta(seq uint64, d *events.Delta) error
	// Restore replaces the state with a snapshot's segments (each valid
	// until the next call of next; io.EOF after the last).
	Restore(next func() ([]byte, error)) error
	// Reset forgets everything the worker holds.
	Reset(reason string)
}

// WorkerSet adds and removes a replica's workers as agents come and go.
type WorkerSet interface {
	// AddWorker returns the sink of a newly registered worker.
	AddWorker(ref events.WorkerRef, reg *fleetv1.Registration) (KeyedSink, error)
	// RemoveWorker forgets a worker whose registration is gone.
	RemoveWorker(ref events.WorkerRef)
}

// SourceOptions configure a Source.
type SourceOptions struct {
	// Bucket is the agents' key-value bucket; "" means DefaultBucket.
	Bucket string
	// TTL is the bucket's entry lifetime if the source creates it; 0 means 10 s.
	TTL time.Duration
	// Models, when not empty, restricts the replica to these models (a shard).
	Models []string
	// SnapshotTimeout bounds one snapshot transfer; 0 means 10 s.
	SnapshotTimeout time.Duration
	// SnapshotConcurrency bounds snapshots loading at once (others wait,
	// RECOVERING); 0 means GOMAXPROCS (docs/benchmarks.md, "Fleet").
	// Unbounded, answers overflow nats-server's per-client buffer and workers
	// resync again and again: keep it times the largest snapshot under
	// max_pending.
	SnapshotConcurrency int
	// QueueSize bounds each worker's waiting deltas (also while a snapshot
	// loads); past it the worker resyncs. 0 means 65,536.
	QueueSize int
	// ResyncBackoff is the wait before retrying a failed resync, doubling to
	// 10 s; 0 means 200 ms.
	ResyncBackoff time.Duration
	// StaleAfterDisconnect marks every worker STALE once NATS has been
	// unreachable this long (RECOVERING before); 0 means 5 s, negative never.
	StaleAfterDisconnect time.Duration
	// LogEvery rate-limits repeated problem logs per worker; 0 means 1 min.
	LogEvery time.Duration
	// Logger receives problem reports; nil discards them.
	Logger *slog.Logger
	// Applied, when set, is called on the worker's goroutine after each
	// applied delta, e.g. to measure lag (testbed/cmd/kvfleetbench); the
	// next delta waits for it.
	Applied func(ref events.WorkerRef, d AppliedDelta)
}

// AppliedDelta describes a delta a Source applied (SourceOptions.Applied).
type AppliedDelta struct {
	// Seq is the delta's seq within the agent's epoch; EngineSeq and
	// EngineTime (engine clock, seconds; 0 unknown) the engine batch's.
	Seq, EngineSeq uint64
	EngineTime     float64
	// Entries is the number of effects applied.
	Entries int
}

func (o *SourceOptions) defaults() {
	defaults.Zero(&o.Bucket, DefaultBucket)
	defaults.Positive(&o.TTL, 10*time.Second)
	defaults.Positive(&o.SnapshotTimeout, 10*time.Second)
	defaults.Positive(&o.SnapshotConcurrency, runtime.GOMAXPROCS(0))
	defaults.Positive(&o.QueueSize, 1<<16)
	defaults.Positive(&o.ResyncBackoff, 200*time.Millisecond)
	defaults.Positive(&o.LogEvery, time.Minute)
	defaults.Zero(&o.StaleAfterDisconnect, 5*time.Second)
	defaults.Zero(&o.Logger, slog.New(slog.DiscardHandler))
}

// Source is a replica's fleet input: per registered worker it buffers the
// deltas, loads a snapshot, applies the deltas after its seq and follows;
// it resyncs as the package doc says, RECOVERING meanwhile. It implements
// events.StatsSource and events.HealthSource. Run watches the bucket and runs
// one goroutine per worker, which alone applies its snapshots and deltas;
// NATS delivers into the worker's bounded queue. mu guards the table.
type Source struct {
	nc  *nats.Conn
	o   SourceOptions
	set WorkerSet
	log *slog.Logger

	mu      sync.RWMutex // guards workers
	workers map[string]*replicaWorker
	wg      sync.WaitGroup

	loading chan struct{} // a token per snapshot loading (SnapshotConcurrency)

	reconnects    atomic.Int64
	watchRestarts atomic.Int64
	downSince     atomic.Int64 // unix ns NATS was lost at; 0 while connected
	// rewatch asks the bucket's watch to start again (buffered 1): after a
	// reconnection, the ordered consumer behind it may be gone with the
	// server, and nats.go notices only after two missed 5 s heartbeats,
	// while registrations age into STALE after half their TTL.
	rewatch chan struct{}
	foreign atomic.Int64 // registrations that do not parse or do not match their key

	logMu sync.Mutex // guards logl
	logl  lograte.Limiter
}

// NewSource returns a source over nc feeding set; nothing happens until Run.
func NewSource(nc *nats.Conn, set WorkerSet, o SourceOptions) *Source {
	o.defaults()
	return &Source{nc: nc, o: o, set: set, log: o.Logger, workers: map[string]*replicaWorker{}, loading: make(chan struct{}, o.SnapshotConcurrency),
		rewatch: make(chan struct{}, 1)}
}

// Run watches the bucket and syncs the workers until ctx is done. NATS or
// JetStream failing, or the watch ending, do not stop it: it retries (backoff
// to 10 s, counted in WatchRestarts) while known workers keep their state.
func (s *Source) Run(ctx context.Context) error {
	prevReconnect := s.nc.Opts.ReconnectedCB
	s.nc.SetReconnectHandler(func(nc *nats.Conn) {
		s.downSince.Store(0)
		s.reconnects.Add(1)
		s.each(func(w *replicaWorker) { w.askResync("NATS reconnected: deltas may have been lost") })
		select {
		case s.rewatch <- struct{}{}:
		default:
		}
		if prevReconnect != nil {
			prevReconnect(nc)
		}
	})
	prevDisconnect := s.nc.Opts.DisconnectedErrCB
	s.nc.SetDisconnectErrHandler(func(nc *nats.Conn, err error) {
		s.downSince.CompareAndSwap(0, time.Now().UnixNano())
		s.each(func(w *replicaWorker) {
			w.live.Store(false)
			w.health.Store(events.HealthRecovering)
			w.note("NATS connection lost")
		})
		if prevDisconnect != nil {
			prevDisconnect(nc, err)
		}
	})
	defer s.stopAll()
	wdone := make(chan struct{})
	defer func() { <-wdone }()
	go func() { defer close(wdone); s.watchdog(ctx) }()
	backoff := s.o.ResyncBackoff
	for {
		err := s.watch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errRewatch) {
			backoff = s.o.ResyncBackoff
			continue
		}
		s.watchRestarts.Add(1)
		now := time.Now()
		s.logMu.Lock()
		ok, held := s.logl.Allow(now, s.o.LogEvery)
		s.logMu.Unlock()
		if ok {
			s.log.Warn("watching the agents' bucket failed; retrying", "bucket", s.o.Bucket, "err", err, "suppressed", held)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// errRewatch ends a watch that a reconnection asked to start again.
var errRewatch = errors.New("nats: bucket watch restarted after a reconnection")

// watch opens the bucket and follows its entries until the watch ends.
func (s *Source) watch(ctx context.Context) error {
	kv, err := Bucket(ctx, s.nc, s.o.Bucket, s.o.TTL)
	if err != nil {
		return err
	}
	var filters []string
	for _, m := range s.o.Models {
		filters = append(filters, Token(m)+".>")
	}
	var w jetstream.KeyWatcher
	if len(filters) == 0 {
		w, err = kv.WatchAll(ctx)
	} else {
		w, err = kv.WatchFiltered(ctx, filters)
	}
	if err != nil {
		return fmt.Errorf("nats: watch bucket %s: %w", s.o.Bucket, err)
	}
	defer func() { _ = w.Stop() }()
	seen := map[string]bool{}
	initial := true
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.rewatch:
			return errRewatch
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("nats: watch of bucket %s ended", s.o.Bucket)
			}
			if e == nil {
				// Initial values delivered: known workers not among them are gone.
				if initial {
					initial = false
					s.dropUnseen(seen)
				}
				continue
			}
			if initial {
				seen[e.Key()] = true
			}
			s.onEntry(ctx, e)
		}
	}
}

// dropUnseen removes the workers whose keys a fresh watch did not list.
func (s *Source) dropUnseen(seen map[string]bool) {
	var gone []string
	s.each(func(w *replicaWorker) {
		if !seen[w.key] {
			gone = append(gone, w.key)
		}
	})
	for _, k := range gone {
		s.remove(k)
	}
}

// watchdog re-derives health a few times a second, so time alone (NATS
// down, an agent silent) turns workers STALE.
func (s *Source) watchdog(ctx context.Context) {
	tick.Every(ctx, 100*time.Millisecond, func(time.Time) { s.each(func(w *replicaWorker) { w.refreshHealth() }) })
}

// WatchRestarts counts restarts of the bucket watch.
func (s *Source) WatchRestarts() int64 { return s.watchRestarts.Load() }

// onEntry adds, updates or removes the worker of one bucket entry.
func (s *Source) onEntry(ctx context.Context, e jetstream.KeyValueEntry) {
	key := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		s.remove(key)
		return
	}
	model, ref, ok := ParseWorkerKey(key)
	reg := &fleetv1.Registration{}
	if !ok || proto.Unmarshal(e.Value(), reg) != nil || reg.GetModel() != model || reg.GetPod() != ref.Pod || int(reg.GetDpRank()) != ref.DPRank {
		if n := s.foreign.Add(1); n == 1 || n%1000 == 0 {
			s.log.Warn("agent registration ignored: it does not parse or does not match its key", "key", key, "ignored_so_far", n)
		}
		return
	}
	s.mu.Lock()
	w := s.workers[key]
	s.mu.Unlock()
	if w != nil {
		w.update(reg, e.Revision())
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	w = &replicaWorker{src: s, key: key, ref: ref, cancel: cancel,
		in: newDeltaQueue(s.o.QueueSize), resync: make(chan struct{}, 1), reg: reg, regRev: e.Revision(),
		stats: events.WorkerStats{Worker: ref, Endpoint: "nats:" + reg.GetDeltaSubject(), Topic: reg.GetDeltaSubject()}}
	w.health.Store(events.HealthRecovering)
	w.regAt.Store(time.Now().UnixNano())
	// Register the health cell before the worker exists in the index.
	s.mu.Lock()
	s.workers[key] = w
	s.mu.Unlock()
	fail := func(what string, err error) {
		cancel()
		s.mu.Lock()
		delete(s.workers, key)
		s.mu.Unlock()
		s.log.Warn(what, "worker", ref.String(), "model", model, "err", err)
	}
	sink, err := s.set.AddWorker(ref, reg)
	if err != nil {
		fail("cannot add a registered worker", err)
		return
	}
	w.sink = sink
	if w.sub, err = s.nc.Subscribe(reg.GetDeltaSubject(), w.enqueue); err != nil {
		s.set.RemoveWorker(ref)
		fail("cannot subscribe to a worker's deltas", err)
		return
	}
	_ = w.sub.SetPendingLimits(-1, -1) // the worker's own queue bounds it
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		w.run(wctx)
	}()
	s.log.Info("fleet worker discovered", "worker", ref.String(), "model", model, "epoch", reg.GetEpoch())
}

// remove stops and forgets the worker of key.
func (s *Source) remove(key string) {
	s.mu.Lock()
	w := s.workers[key]
	delete(s.workers, key)
	s.mu.Unlock()
	if w == nil {
		return
	}
	w.stop()
	s.set.RemoveWorker(w.ref)
	s.log.Info("fleet worker gone: its registration expired or was removed", "worker", w.ref.String())
}

func (s *Source) stopAll() {
	s.mu.Lock()
	ws := s.workers
	s.workers = map[string]*replicaWorker{}
	s.mu.Unlock()
	for _, w := range ws {
		w.stop()
	}
	s.wg.Wait()
}

func (s *Source) each(f func(*replicaWorker)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, w := range s.workers {
		f(w)
	}
}

// Foreign counts bucket entries ignored: unparsable or not matching their key.
func (s *Source) Foreign() int64 { return s.foreign.Load() }

// Reconnects counts NATS reconnections (each resynced every worker).
func (s *Source) Reconnects() int64 { return s.reconnects.Load() }

// WorkerStats implements events.StatsSource.
func (s *Source) WorkerStats() []events.WorkerStats {
	var out []events.WorkerStats
	s.each(func(w *replicaWorker) { out = append(out, w.snapshotStats()) })
	return out
}

// Health implements events.HealthSource.
func (s *Source) Health(ref events.WorkerRef) *events.HealthCell {
	var cell *events.HealthCell
	s.each(func(w *replicaWorker) {
		if w.ref == ref {
			cell = &w.health
		}
	})
	return cell
}
