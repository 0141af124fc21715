package natsbus

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/lograte"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

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

	// owned by the worker's goroutine; synced: live once, so a resync
	// replaces a state that may name blocks no longer held.
	synced     bool
	epoch, seq uint64
	fresh      bool // no delta applied since the last snapshot
	msg        fleetv1.Delta
	delta      events.Delta

	mu       sync.Mutex // guards stats, staleWhy and log
	stats    events.WorkerStats
	staleWhy string // why the worker is STALE, "" when it is not
	logl     lograte.Limiter
}

// staleReason says why the state is too old to route by ("" if not): NATS
// unreachable past StaleAfterDisconnect, or the registration not refreshed
// for half its TTL (two heartbeats missed).
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

// enqueue hands a delta to the worker; a full queue asks for a resync.
func (w *replicaWorker) enqueue(m *nats.Msg) {
	if !w.in.push(m) {
		w.count(&w.stats.Dropped)
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

// update takes a refreshed registration: a new epoch resyncs; otherwise the
// agent's view of the engine decides health.
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
	w.count(&w.stats.Replays)
	select { // a resync asked before this one started is this one
	case <-w.resync:
	default:
	}
	if w.synced {
		// The state may name blocks no longer held: drop it while the
		// snapshot loads.
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
		w.count(&w.stats.ReplayFailures)
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

// loadSnapshot restores the sink from the agent's snapshot, streaming chunks.
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
			// The segments alias m.Data until the restore asks for more.
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
		// Drain what waits (ready is signalled only when a push finds the
		// queue empty), noticing a resync or the end between deltas.
		select {
		case <-ctx.Done():
			return
		case <-w.resync:
			return
		default:
		}
		if m := w.in.pop(); m != nil {
			if !w.onDelta(m) {
				return
			}
			continue
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
		w.count(&w.stats.DecodeErrors)
		w.problem(err)
		return false // its effects are unknown: resync
	}
	switch {
	case w.msg.Epoch != w.epoch:
		if w.msg.Epoch != w.registration().GetEpoch() {
			// Another publisher on the subject (a second or old agent):
			// counted and ignored.
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
			w.count(&w.stats.Duplicates)
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
		w.count(&w.stats.DecodeErrors)
		w.problem(err)
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

// refreshHealth sets the health: STALE or RECOVERING, else what the agent
// reports of its engine, at best UNSYNCED when its state is partial.
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

// count adds one to the stats counter c, under mu.
func (w *replicaWorker) count(c *int64) {
	w.mu.Lock()
	*c++
	w.mu.Unlock()
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
