package natsbus

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/lograte"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

// KeyedSink is a replica's worker, fed with keyed deltas and snapshots:
// the index implements it.
type KeyedSink interface {
	// ApplyDelta applies delta seq's entries in order; an entry that does
	// not fit the worker's state is an error (the source resyncs).
	ApplyDelta(seq uint64, d *events.Delta) error
	// Restore replaces the worker's state with a snapshot's segments (in
	// the index's binary encoding, valid until the next call of next);
	// next returns io.EOF after the last.
	Restore(next func() ([]byte, error)) error
	// Reset forgets everything the worker holds.
	Reset(reason string)
}

// WorkerSet adds and removes a replica's workers as agents register and
// expire.
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
	// TTL is the bucket's entry lifetime when the source creates it; 0
	// means 10 s.
	TTL time.Duration
	// Models, when not empty, restricts the replica to these models (a
	// replica shard).
	Models []string
	// SnapshotTimeout bounds one snapshot transfer; 0 means 10 s.
	SnapshotTimeout time.Duration
	// SnapshotConcurrency bounds the snapshots loading at once (the
	// others wait their turn, RECOVERING); 0 means GOMAXPROCS.
	// Unbounded, a replica that discovers a fleet asks every agent at
	// once, and the answers (300 MB for 1,000 workers of 30,000 blocks)
	// overflow what nats-server buffers for one client (64 MiB by
	// default): it cuts the replica off as a slow consumer, and every
	// worker resyncs, again and again. One load a core keeps the cores
	// restoring (a snapshot's transfer takes a few percent of its
	// restore); two a core were slower, their working sets competing for
	// the caches (docs/benchmarks.md, "Fleet"). The bound is in
	// snapshots: keep it times the largest snapshot under the server's
	// max_pending.
	SnapshotConcurrency int
	// QueueSize bounds each worker's deltas waiting to be applied (and
	// buffered while a snapshot loads); past it the worker resyncs. 0
	// means 65,536.
	QueueSize int
	// ResyncBackoff is the wait before retrying a failed resync, doubling
	// to 10 s; 0 means 200 ms.
	ResyncBackoff time.Duration
	// StaleAfterDisconnect marks every worker STALE (left out of answers)
	// once NATS has been unreachable this long: its state is then too old
	// to route by. Until then the workers are RECOVERING. 0 means 5 s;
	// negative, never.
	StaleAfterDisconnect time.Duration
	// LogEvery rate-limits repeated problem logs per worker; 0 means 1 min.
	LogEvery time.Duration
	// Logger receives problem reports; nil discards them.
	Logger *slog.Logger
	// Applied, when set, is called on a worker's goroutine after each of
	// its deltas has been applied (not after one that did not fit), with
	// the delta's header: e.g. to measure the lag from the engine's batch
	// to the replica (testbed/cmd/kvfleetbench). The worker's next delta waits for
	// it, so it must return quickly.
	Applied func(ref events.WorkerRef, d AppliedDelta)
}

// AppliedDelta describes a delta a Source has applied (see
// SourceOptions.Applied).
type AppliedDelta struct {
	// Seq is the delta's seq within the agent's epoch; EngineSeq and
	// EngineTime are the seq and time (seconds since the epoch, by the
	// engine's clock; 0 when unknown) of the engine batch it records.
	Seq, EngineSeq uint64
	EngineTime     float64
	// Entries is the number of effects applied.
	Entries int
}

func (o *SourceOptions) defaults() {
	if o.Bucket == "" {
		o.Bucket = DefaultBucket
	}
	if o.TTL <= 0 {
		o.TTL = 10 * time.Second
	}
	if o.SnapshotTimeout <= 0 {
		o.SnapshotTimeout = 10 * time.Second
	}
	if o.SnapshotConcurrency <= 0 {
		o.SnapshotConcurrency = runtime.GOMAXPROCS(0)
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 1 << 16
	}
	if o.ResyncBackoff <= 0 {
		o.ResyncBackoff = 200 * time.Millisecond
	}
	if o.LogEvery <= 0 {
		o.LogEvery = time.Minute
	}
	if o.StaleAfterDisconnect == 0 {
		o.StaleAfterDisconnect = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Source is a replica's fleet input: it watches the agents' bucket, and
// for each registered worker (of its models) subscribes to the worker's
// deltas, buffers them, loads a snapshot from the agent, applies the
// deltas after the snapshot's seq, and then follows the stream. A seq gap,
// a new epoch, a delta that does not fit, a full queue or a NATS
// reconnection resyncs the worker from a fresh snapshot; while it
// resyncs the worker is RECOVERING. It implements events.StatsSource and
// events.HealthSource.
//
// # Concurrency
//
// Run watches the bucket on its goroutine and runs one goroutine per
// worker, which alone applies that worker's snapshots and deltas. NATS
// delivers deltas on its own goroutines into the worker's bounded queue.
// mu guards the worker table; Stats and Health may be called from any
// goroutine.
type Source struct {
	nc  *nats.Conn
	o   SourceOptions
	set WorkerSet
	log *slog.Logger

	mu      sync.RWMutex // guards workers
	workers map[string]*replicaWorker
	wg      sync.WaitGroup

	// loading holds a token per snapshot being loaded
	// (SnapshotConcurrency).
	loading chan struct{}

	reconnects    atomic.Int64
	watchRestarts atomic.Int64
	downSince     atomic.Int64 // unix ns NATS was lost at; 0 while connected
	foreign       atomic.Int64 // registrations that do not parse or do not match their key

	logMu sync.Mutex // guards logl
	logl  lograte.Limiter
}

// NewSource returns a source over nc feeding set. Nothing happens until
// Run.
func NewSource(nc *nats.Conn, set WorkerSet, o SourceOptions) *Source {
	o.defaults()
	return &Source{nc: nc, o: o, set: set, log: o.Logger, workers: map[string]*replicaWorker{}, loading: make(chan struct{}, o.SnapshotConcurrency)}
}

// replicaWorker is one worker's sync state.
type replicaWorker struct {
	src  *Source
	key  string
	ref  events.WorkerRef
	sink KeyedSink

	in     *deltaQueue
	resync chan struct{} // a value asks the worker's goroutine to resync
	cancel context.CancelFunc
	sub    *nats.Subscription
	health events.HealthCell

	regMu  sync.Mutex // guards reg and regRev
	reg    *fleetv1.Registration
	regRev uint64 // the bucket revision of reg

	live  atomic.Bool  // synced and following the stream
	regAt atomic.Int64 // unix ns the registration was last written (as received here)

	// synced: the worker has been live once, so a resync replaces a state
	// that may name blocks the worker no longer holds (owned by the
	// worker's goroutine).
	synced bool

	// owned by the worker's goroutine
	epoch, seq uint64
	fresh      bool // no delta applied since the last snapshot
	msg        fleetv1.Delta
	delta      events.Delta

	mu       sync.Mutex // guards stats, staleWhy and log
	stats    events.WorkerStats
	staleWhy string // why the worker is STALE, "" when it is not
	logl     lograte.Limiter
}

// Run watches the bucket and syncs the workers until ctx is done. NATS
// being unreachable, JetStream not answering or the watch ending do not
// stop it: it retries (with backoff to 10 s, counted in WatchRestarts)
// while the workers it knows keep their state and their health says why.
func (s *Source) Run(ctx context.Context) error {
	prevReconnect := s.nc.Opts.ReconnectedCB
	s.nc.SetReconnectHandler(func(nc *nats.Conn) {
		s.downSince.Store(0)
		s.reconnects.Add(1)
		s.resyncAll("NATS reconnected: deltas may have been lost")
		if prevReconnect != nil {
			prevReconnect(nc)
		}
	})
	prevDisconnect := s.nc.Opts.DisconnectedErrCB
	s.nc.SetDisconnectErrHandler(func(nc *nats.Conn, err error) {
		s.downSince.CompareAndSwap(0, time.Now().UnixNano())
		s.flagAll("NATS connection lost")
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
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("nats: watch of bucket %s ended", s.o.Bucket)
			}
			if e == nil {
				// The initial values are all delivered: a worker known
				// from an earlier watch and not among them is gone.
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

// watchdog re-derives every worker's health a few times a second, so that
// time alone (NATS down too long, an agent gone silent) turns workers
// STALE without an event to trigger it.
func (s *Source) watchdog(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.each(func(w *replicaWorker) { w.refreshHealth() })
		}
	}
}

// staleReason says why a worker's state is too old to route by, "" when
// it is not: NATS unreachable past StaleAfterDisconnect, or the agent's
// registration not refreshed for half its TTL (two heartbeats missed:
// the agent is dead or cut off, and its entry will expire).
func (w *replicaWorker) staleReason(now time.Time) string {
	if d := w.src.downSince.Load(); d != 0 && w.src.o.StaleAfterDisconnect > 0 {
		if down := now.Sub(time.Unix(0, d)); down >= w.src.o.StaleAfterDisconnect {
			return fmt.Sprintf("NATS unreachable for %v", down.Round(time.Millisecond))
		}
	}
	if at := w.regAt.Load(); at != 0 {
		if quiet := now.Sub(time.Unix(0, at)); quiet >= w.src.o.TTL/2 {
			return fmt.Sprintf("the agent has not refreshed its registration for %v", quiet.Round(time.Millisecond))
		}
	}
	return ""
}

// WatchRestarts counts restarts of the bucket watch (NATS or JetStream
// unreachable, the watch ended).
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
	// Register the worker (and so its health cell) before it exists in
	// the index, so that nobody sees the worker without its health.
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

func (s *Source) resyncAll(why string) {
	s.each(func(w *replicaWorker) { w.askResync(why) })
}

func (s *Source) flagAll(why string) {
	s.each(func(w *replicaWorker) {
		w.live.Store(false)
		w.health.Store(events.HealthRecovering)
		w.note(why)
	})
}

// Foreign counts bucket entries ignored because they do not parse or do
// not match their key.
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

// enqueue hands a delta to the worker's goroutine; a full queue asks for a
// resync (the dropped delta is recovered by the snapshot).
func (w *replicaWorker) enqueue(m *nats.Msg) {
	if !w.in.push(m) {
		w.mu.Lock()
		w.stats.Dropped++
		w.mu.Unlock()
		w.askResync("delta queue full")
	}
}

func (w *replicaWorker) askResync(why string) {
	w.note(why)
	select {
	case w.resync <- struct{}{}:
	default:
	}
}

func (w *replicaWorker) stop() {
	if w.sub != nil {
		_ = w.sub.Unsubscribe()
	}
	w.cancel()
}

// update takes a refreshed registration: a new epoch resyncs, and the
// agent's view of the engine decides health when the replica is live.
func (w *replicaWorker) update(reg *fleetv1.Registration, rev uint64) {
	w.regMu.Lock()
	old := w.reg
	w.reg = reg
	fresh := rev > w.regRev
	w.regRev = max(w.regRev, rev)
	w.regMu.Unlock()
	if fresh { // a restarted watch delivers the entry it already had
		w.regAt.Store(time.Now().UnixNano())
	}
	if old.GetEpoch() != reg.GetEpoch() {
		w.askResync(fmt.Sprintf("agent epoch changed from %d to %d (the agent restarted)", old.GetEpoch(), reg.GetEpoch()))
		return
	}
	w.refreshHealth()
}

// registration returns the worker's latest registration.
func (w *replicaWorker) registration() *fleetv1.Registration {
	w.regMu.Lock()
	defer w.regMu.Unlock()
	return w.reg
}

// run is the worker's goroutine: sync from a snapshot, then follow.
func (w *replicaWorker) run(ctx context.Context) {
	backoff := w.src.o.ResyncBackoff
	for ctx.Err() == nil {
		if err := w.sync(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			w.problem(err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 10*time.Second)
			continue
		}
		backoff = w.src.o.ResyncBackoff
		w.follow(ctx)
	}
}

// sync loads a snapshot and applies the deltas buffered meanwhile.
func (w *replicaWorker) sync(ctx context.Context) error {
	w.live.Store(false)
	w.health.Store(events.HealthRecovering)
	w.mu.Lock()
	w.stats.Replays++
	w.mu.Unlock()
	select { // a resync asked before this one started is this one
	case <-w.resync:
	default:
	}
	if w.synced {
		// The state may name blocks the worker no longer holds (the
		// deltas that removed them are what was lost): answers must not
		// name them while the snapshot loads.
		w.mu.Lock()
		why := w.stats.HealthReason
		w.mu.Unlock()
		w.sink.Reset("fleet resync: " + why)
		w.synced = false
	}
	select { // wait for a turn (SnapshotConcurrency)
	case w.src.loading <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	reg := w.registration()
	epoch, seq, err := w.loadSnapshot(ctx, reg)
	<-w.src.loading
	if err != nil {
		w.mu.Lock()
		w.stats.ReplayFailures++
		w.mu.Unlock()
		return err
	}
	w.epoch, w.seq, w.fresh = epoch, seq, true
	w.synced = true
	w.regAt.Store(time.Now().UnixNano()) // the agent answered: it is alive
	w.live.Store(true)
	w.mu.Lock()
	w.stats.LastSeq, w.stats.HasSeq = seq, true
	w.mu.Unlock()
	w.refreshHealth()
	return nil
}

// loadSnapshot asks the agent for the worker's snapshot and restores the
// sink from it, streaming chunks as they arrive.
func (w *replicaWorker) loadSnapshot(ctx context.Context, reg *fleetv1.Registration) (epoch, seq uint64, err error) {
	inbox := w.src.nc.NewRespInbox()
	sub, err := w.src.nc.SubscribeSync(inbox)
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot inbox: %w", err)
	}
	defer sub.Unsubscribe()
	_ = sub.SetPendingLimits(-1, -1)
	req, _ := proto.Marshal(&fleetv1.SnapshotRequest{DpRank: uint32(w.ref.DPRank)})
	if err := w.src.nc.PublishRequest(reg.GetSnapshotSubject(), inbox, req); err != nil {
		return 0, 0, fmt.Errorf("snapshot request to %s: %w", reg.GetSnapshotSubject(), err)
	}
	deadline := time.Now().Add(w.src.o.SnapshotTimeout)
	var chunk snapshotChunk
	var segs [][]byte
	index := uint32(0)
	first := true
	done := false
	next := func() ([]byte, error) {
		for len(segs) == 0 {
			if done {
				return nil, io.EOF
			}
			left := time.Until(deadline)
			if left <= 0 {
				return nil, fmt.Errorf("snapshot from %s: no last chunk within %v", reg.GetSnapshotSubject(), w.src.o.SnapshotTimeout)
			}
			mctx, cancel := context.WithTimeout(ctx, left)
			m, err := sub.NextMsgWithContext(mctx)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("snapshot from %s: %w", reg.GetSnapshotSubject(), err)
			}
			// The segments alias m.Data, which nothing else holds, until
			// the restore has taken them all and asks for the next chunk.
			if err := unmarshalChunk(m.Data, &chunk); err != nil {
				return nil, err
			}
			if chunk.err != "" {
				return nil, fmt.Errorf("agent cannot serve the snapshot: %s", chunk.err)
			}
			if first {
				epoch, seq, first = chunk.epoch, chunk.seq, false
			} else if chunk.epoch != epoch || chunk.seq != seq {
				return nil, fmt.Errorf("%w: snapshot chunk %d of epoch %d seq %d in a snapshot of epoch %d seq %d", ErrMalformed, chunk.index, chunk.epoch, chunk.seq, epoch, seq)
			}
			if chunk.index != index {
				return nil, fmt.Errorf("%w: snapshot chunk %d, want %d", ErrMalformed, chunk.index, index)
			}
			index++
			segs, done = chunk.segments, chunk.last
		}
		s := segs[0]
		segs = segs[1:]
		return s, nil
	}
	if err := w.sink.Restore(next); err != nil {
		w.sink.Reset("snapshot failed: " + err.Error())
		return 0, 0, err
	}
	if first {
		return 0, 0, fmt.Errorf("snapshot from %s: no chunk", reg.GetSnapshotSubject())
	}
	return epoch, seq, nil
}

// follow applies deltas in order until a resync is needed.
func (w *replicaWorker) follow(ctx context.Context) {
	for {
		// Drain what waits (deltas queued while a snapshot loaded
		// included: the queue signals ready only when a push finds it
		// empty), noticing a resync or the end between deltas.
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.resync:
				return
			default:
			}
			m := w.in.pop()
			if m == nil {
				break
			}
			if !w.onDelta(m) {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-w.resync:
			return
		case <-w.in.ready:
		}
	}
}

// onDelta applies one delta message and reports whether the worker is
// still in sync.
func (w *replicaWorker) onDelta(m *nats.Msg) bool {
	now := time.Now()
	if err := unmarshalDelta(m.Data, &w.msg); err != nil {
		w.decodeProblem(err)
		return false // its effects are unknown: resync
	}
	switch {
	case w.msg.Epoch != w.epoch:
		if w.msg.Epoch != w.registration().GetEpoch() {
			// Neither the synced epoch nor the registered agent's: another
			// publisher on the worker's subject (a second agent for the
			// pod, an old one still running). Counted and ignored.
			w.mu.Lock()
			w.stats.Conflicts++
			n := w.stats.Conflicts
			w.mu.Unlock()
			if n == 1 || n%1000 == 0 {
				w.src.log.Warn("delta of an unknown agent epoch ignored: another publisher on the worker's subject", "worker", w.ref.String(), "epoch", w.msg.Epoch, "registered_epoch", w.registration().GetEpoch(), "ignored_so_far", n)
			}
			return true
		}
		w.note(fmt.Sprintf("deltas of a new agent epoch %d", w.msg.Epoch))
		return false
	case w.msg.Seq <= w.seq:
		if !w.fresh { // repeated; before the first after a snapshot, the snapshot covers it
			w.mu.Lock()
			w.stats.Duplicates++
			w.mu.Unlock()
		}
		return true
	case w.msg.Seq > w.seq+1:
		w.mu.Lock()
		w.stats.Gaps++
		w.stats.MissedBatches += int64(w.msg.Seq - w.seq - 1)
		w.mu.Unlock()
		w.note(fmt.Sprintf("deltas %d..%d lost", w.seq+1, w.msg.Seq-1))
		return false
	}
	if err := decodeDelta(&w.msg, &w.delta); err != nil {
		w.decodeProblem(err)
		return false
	}
	w.seq, w.fresh = w.msg.Seq, false
	err := w.sink.ApplyDelta(w.seq, &w.delta)
	w.mu.Lock()
	w.stats.Batches++
	w.stats.Events += int64(len(w.delta.Entries))
	w.stats.LastSeq, w.stats.HasSeq = w.seq, true
	w.stats.LastMessage = now
	if err != nil {
		w.stats.ApplyErrors++
	}
	w.mu.Unlock()
	if err != nil {
		w.problem(fmt.Errorf("delta %d: %w", w.seq, err))
		return false // the replica diverged from the agent: resync
	}
	if f := w.src.o.Applied; f != nil {
		f(w.ref, AppliedDelta{Seq: w.seq, EngineSeq: w.msg.EngineSeq, EngineTime: w.msg.EngineTime, Entries: len(w.delta.Entries)})
	}
	w.refreshHealth()
	return true
}

// refreshHealth sets the worker's health: RECOVERING while not live,
// otherwise what the agent reports of its engine, and at best UNSYNCED
// when the agent marks its state partial (answers may miss blocks the
// engine holds).
func (w *replicaWorker) refreshHealth() {
	r := w.staleReason(time.Now())
	w.mu.Lock()
	w.staleWhy = r
	w.mu.Unlock()
	if r != "" {
		w.health.Store(events.HealthStale)
		return
	}
	if !w.live.Load() {
		w.health.Store(events.HealthRecovering)
		return
	}
	reg := w.registration()
	h := parseHealth(reg.GetHealth())
	if h == events.HealthUnknown {
		h = events.HealthOK
	}
	if reg.GetPartial() && h == events.HealthOK {
		h = events.HealthUnsynced
	}
	w.health.Store(h)
}

// parseHealth reads a Health's name.
func parseHealth(s string) events.Health {
	for h := events.HealthUnknown; int(h) < events.NumHealth; h++ {
		if h.String() == s {
			return h
		}
	}
	return events.HealthUnknown
}

func (w *replicaWorker) decodeProblem(err error) {
	w.mu.Lock()
	w.stats.DecodeErrors++
	w.mu.Unlock()
	w.problem(err)
}

// problem records err and logs it, rate-limited by time per worker.
func (w *replicaWorker) problem(err error) {
	now := time.Now()
	w.mu.Lock()
	w.stats.LastError = err.Error()
	ok, held := w.logl.Allow(now, w.src.o.LogEvery)
	w.mu.Unlock()
	if ok {
		w.src.log.Warn("fleet worker problem; resyncing", "worker", w.ref.String(), "err", err, "suppressed", held)
	}
}

// note records why the worker resyncs.
func (w *replicaWorker) note(why string) {
	w.mu.Lock()
	w.stats.HealthReason = why
	w.mu.Unlock()
}

func (w *replicaWorker) snapshotStats() events.WorkerStats {
	w.mu.Lock()
	s := w.stats
	staleWhy := w.staleWhy
	w.mu.Unlock()
	s.Health = w.health.Load()
	s.Backlog = w.in.len()
	s.Connected = w.src.nc.IsConnected()
	reg := w.registration()
	switch {
	case s.Health == events.HealthRecovering:
		if s.HealthReason == "" {
			s.HealthReason = "loading a snapshot from the agent"
		}
	case s.Health == events.HealthStale && staleWhy != "":
		s.HealthReason = staleWhy
	case reg.GetPartial() && (reg.GetHealth() == events.HealthOK.String() || reg.GetHealth() == events.HealthUnsynced.String()):
		// The agent's reason is the partial state's (or says nothing).
		s.HealthReason = strings.TrimSuffix("the agent's state lacks part of the engine's history: "+reg.GetHealthReason(), ": ")
		return s
	case s.Health != events.HealthOK:
		s.HealthReason = "the agent reports " + reg.GetHealth() + ": " + reg.GetHealthReason()
	default:
		s.HealthReason = ""
	}
	if reg.GetPartial() {
		s.HealthReason = strings.TrimPrefix(s.HealthReason+"; ", "; ") + "the agent's state lacks part of the engine's history"
	}
	return s
}
