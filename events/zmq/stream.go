package zmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/lograte"
)

// message is one received event message on its way to its worker's stream.
type message struct {
	seq       uint64
	batch     *events.Batch // nil when decodeErr is set
	decodeErr error
	at        time.Time
	size      int64  // payload bytes, for the queue's byte bound
	sum       uint64 // xxh3 of the payload, to tell a duplicate from a restart
	newEpoch  string // SGLang: the topic names a new engine epoch
}

// replayResult is what a replay fetch hands back to its stream. gen is
// the stream's replay generation when the fetch started: a stream accepts
// only the result of its current recovery, so a result of one it gave up
// on (too slow) is dropped and counted, even when a later recovery asked
// for the same seq.
type replayResult struct {
	gen     uint64
	from    uint64
	batches []replayedBatch
	err     error
}

// stream is one worker's ordered event pipeline: it receives decoded
// messages from a receiver, tracks seq, fills gaps by replay, and applies
// batches to the worker's events.Sink.
//
// # Concurrency
//
// The fields under "owned by run" are touched only by the stream's run
// goroutine. mu guards stats. The atomics are written by their owners
// (receiver, run) and read by the health checker and Score.
type stream struct {
	sub    *Subscriber
	ref    events.WorkerRef
	sink   events.Sink
	replay string // replay endpoint, "" for none

	in         chan message
	queued     atomic.Int64 // payload bytes in in
	replayDone chan replayResult
	// rxEpoch is the last SGLang epoch seen in the worker's topic, owned
	// by the stream's one receiver.
	rxEpoch []byte
	// connectedCh has a value when the pull-mode socket (re)connected.
	connectedCh chan struct{}
	health      events.HealthCell

	// owned by run
	expected    uint64
	hasExpected bool
	recovering  bool
	recoverFrom uint64
	replayGen   uint64 // bumped by each startRecovery
	rounds      int    // answers of the current recovery asked again for what they dropped
	// recent are the last applied messages by seq mod len, to recognise a
	// repeated one.
	recent [recentSeqs]struct {
		seq, sum uint64
		ok       bool
	}
	// back is the expected seq before the last time seq went back, and
	// when: a message that continues it is a second publisher.
	back   uint64
	backAt time.Time
	// backs counts seqs that went back since backFirst.
	backs     int
	backFirst time.Time
	// conflict: two publishers interleave; next and last are each one's
	// next seq and last message time.
	conflict     bool
	next         [2]uint64
	last         [2]time.Time
	pending      []message
	pendingBytes int64 // payload bytes of pending
	backoffUntil time.Time
	backoff      time.Duration
	joinTried    bool
	rejoined     bool // the empty join of this connection was asked again
	resuming     bool // restored from a checkpoint; the first connection replays from expected
	dec          *events.Decoder
	replayBatch  events.Batch

	connected      atomic.Bool  // pull mode: the SUB socket has a connection
	disconnected   atomic.Int64 // unix ns since when not connected (0 = connected)
	lastMessage    atomic.Int64 // unix ns of the last message
	isRecovering   atomic.Bool
	unsynced       atomic.Bool
	inConflict     atomic.Bool
	lastBad        atomic.Int64 // unix ns of the last event that could not be decoded or applied
	monitored      bool         // pull mode: connection state is known
	listener       int          // push mode: the listener's index; -1 in pull mode
	model          string       // push mode: the model the worker was created for
	rankMismatches atomic.Int64

	mu    sync.Mutex // guards stats and log
	stats events.WorkerStats
	log   lograte.Limiter
}

func newStream(sub *Subscriber, ref events.WorkerRef, endpoint, topic, replay string, sink events.Sink, monitored bool) *stream {
	st := &stream{
		sub:         sub,
		ref:         ref,
		sink:        sink,
		replay:      replay,
		in:          make(chan message, sub.opts.QueueSize),
		replayDone:  make(chan replayResult, 1),
		connectedCh: make(chan struct{}, 1),
		monitored:   monitored,
		stats:       events.WorkerStats{Worker: ref, Endpoint: endpoint, Topic: topic, ReplayEndpoint: replay},
	}
	st.disconnected.Store(time.Now().UnixNano())
	return st
}

// run is the stream's goroutine.
//
// Joining while the engine already runs, the stream learns what it cached
// from the oldest batch it still buffers (a join replay). In pull mode the
// join waits until the SUB socket is connected, so that an engine started
// after kvindex is asked once it is up (not answered with a timeout), and
// a batch the engine sent before the subscription reached it is in the
// answer; a join that found nothing is asked once more rejoinAfter later,
// for a batch sent while the subscription was still on its way. In push
// mode the connection is not visible, and the join runs at once.
func (st *stream) run(ctx context.Context) {
	if st.replay != "" && !st.monitored {
		st.startRecovery(ctx, 0, nil, "join")
	}
	rejoin := time.NewTimer(time.Hour)
	rejoin.Stop()
	defer rejoin.Stop()
	st.refreshHealth()
	for {
		select {
		case <-ctx.Done():
			st.releasePending()
			return
		case m := <-st.in:
			st.queued.Add(-m.size)
			st.onMessage(ctx, m)
		case r := <-st.replayDone:
			join := r.from == 0 && !st.hasExpected && st.recovering && r.gen == st.replayGen
			st.onReplay(ctx, r)
			if join && !st.hasExpected && !st.recovering && r.err == nil && !st.rejoined {
				st.rejoined = true
				rejoin.Reset(rejoinAfter)
			}
		case <-st.connectedCh:
			switch {
			case st.replay == "" || st.recovering:
			case !st.hasExpected:
				st.rejoined = false
				st.startRecovery(ctx, 0, nil, "join")
			case st.resuming:
				// Restored from a checkpoint: fetch what came since.
				st.resuming = false
				st.startRecovery(ctx, st.expected, nil, "resume")
			}
		case <-rejoin.C:
			if !st.hasExpected && !st.recovering {
				st.startRecovery(ctx, 0, nil, "join")
			}
		}
		st.refreshHealth()
	}
}

// rejoinAfter is how long after an empty join replay it is asked once more:
// longer than a subscription takes to reach a local engine.
const rejoinAfter = time.Second

// enqueue hands a message to the stream without blocking the receiver. A
// full queue drops the message and counts it; the seq gap it leaves is
// then recovered like any other.
func (st *stream) enqueue(m message) {
	if st.queued.Add(m.size) <= st.sub.opts.QueueBytes {
		select {
		case st.in <- m:
			return
		default:
		}
	}
	st.queued.Add(-m.size)
	st.sub.putBatch(m.batch)
	st.mu.Lock()
	st.stats.Dropped++
	st.mu.Unlock()
}

func (st *stream) onMessage(ctx context.Context, m message) {
	st.lastMessage.Store(m.at.UnixNano())
	st.mu.Lock()
	st.stats.LastMessage = m.at
	st.mu.Unlock()
	if st.recovering {
		if len(st.pending) >= st.sub.opts.MaxPending || st.pendingBytes+m.size > st.sub.opts.QueueBytes {
			st.problem(fmt.Errorf("replay from seq %d still running with %d batches (%d bytes) waiting: giving up on it", st.recoverFrom, len(st.pending), st.pendingBytes), false)
			st.recovering = false
			st.isRecovering.Store(false)
			st.unrecoverable(st.recoverFrom, st.pending[0].seq, "replay too slow")
			st.drain(ctx, append(st.pending, m))
			return
		}
		st.pending = append(st.pending, m)
		st.pendingBytes += m.size
		return
	}
	st.process(ctx, m)
}

// process applies one live message in seq order, starting a replay when it
// reveals a gap. Callers are the run goroutine, not recovering.
func (st *stream) process(ctx context.Context, m message) {
	if st.conflict {
		st.inConflictMessage(m)
		return
	}
	if m.newEpoch != "" && st.hasExpected {
		st.restart(fmt.Sprintf("the engine's epoch changed to %q: engine restarted", m.newEpoch))
	}
	switch {
	case !st.hasExpected:
		if m.seq > 0 && st.replay != "" && !st.joinTried && time.Now().After(st.backoffUntil) {
			// Joined late (or the join replay failed): fetch what came before.
			st.startRecovery(ctx, 0, []message{m}, "late join")
			return
		}
		if m.seq > 0 {
			st.mu.Lock()
			st.stats.JoinedAtSeq = m.seq
			st.mu.Unlock()
		}
	case m.seq == st.expected:
	case m.seq > st.expected && st.continuesBack(m.seq, m.at):
		st.startConflict(m)
		return
	case m.seq > st.expected:
		missed := m.seq - st.expected
		st.mu.Lock()
		st.stats.Gaps++
		st.stats.MissedBatches += int64(missed)
		st.mu.Unlock()
		if st.replay != "" && time.Now().After(st.backoffUntil) {
			st.sub.opts.Logger.Info("kv events lost: replaying", "worker", st.ref.String(), "from", st.expected, "to", m.seq-1)
			st.startRecovery(ctx, st.expected, []message{m}, "gap")
			return
		}
		reason := "no replay endpoint"
		if st.replay != "" {
			reason = "replay backing off after a failure"
		}
		st.unrecoverable(st.expected, m.seq, reason)
	case st.duplicate(m):
		st.mu.Lock()
		st.stats.Duplicates++
		st.mu.Unlock()
		st.sub.putBatch(m.batch)
		return
	case st.bounces(m.at):
		st.startConflict(m)
		return
	default: // seq went backwards: a new engine process
		st.restart(fmt.Sprintf("seq went back from %d to %d: engine restarted", st.expected-1, m.seq))
		if m.seq > 0 && st.replay != "" && time.Now().After(st.backoffUntil) {
			st.startRecovery(ctx, 0, []message{m}, "restart")
			return
		}
	}
	st.apply(m)
}

// restart resets the worker after its engine restarted.
func (st *stream) restart(reason string) {
	st.mu.Lock()
	st.stats.Restarts++
	st.mu.Unlock()
	st.sink.Reset(reason)
	st.unsynced.Store(false)
	st.hasExpected = false
	st.sub.opts.Logger.Warn("engine restart detected; worker cleared", "worker", st.ref.String(), "reason", reason)
}

// apply applies a decoded (or undecodable) message and advances expected.
// The stats show its seq only once the sink has applied it (or it was
// counted as undecodable): a reader that sees LastSeq finds the batch's
// blocks in the index.
func (st *stream) apply(m message) {
	st.remember(m.seq, m.sum)
	st.expected, st.hasExpected = m.seq+1, true
	if m.decodeErr != nil {
		st.lastBad.Store(m.at.UnixNano())
		st.problem(fmt.Errorf("seq %d: %w", m.seq, m.decodeErr), true)
		st.mu.Lock()
		st.stats.LastSeq, st.stats.HasSeq = m.seq, true
		st.mu.Unlock()
		return
	}
	st.applyBatch(m.seq, m.batch, false)
	st.sub.putBatch(m.batch)
}

// applyBatch hands b, the engine's batch seq, to the sink, then counts it
// in the stats (Batches, Events, LastSeq, and ReplayedBatches when
// replayed), so that they describe applied batches only.
func (st *stream) applyBatch(seq uint64, b *events.Batch, replayed bool) {
	if b.HasDPRank && b.DPRank != st.ref.DPRank && st.monitored {
		st.rankMismatches.Add(1)
		st.problem(fmt.Errorf("seq %d: batch from data_parallel_rank %d on the endpoint configured for rank %d", seq, b.DPRank, st.ref.DPRank), false)
	}
	for i := range b.Events {
		if b.Events[i].Kind == events.KindAllBlocksCleared {
			// The worker starts again from nothing: what was lost or
			// could not be applied before no longer shows in answers.
			st.unsynced.Store(false)
			st.lastBad.Store(0)
		}
	}
	var err error
	if ss, ok := st.sink.(events.SeqSink); ok {
		err = ss.ApplyBatchAt(seq, b)
	} else {
		err = st.sink.ApplyBatch(b)
	}
	if err != nil {
		st.lastBad.Store(time.Now().UnixNano())
		st.problem(fmt.Errorf("seq %d: %w", seq, err), false)
	}
	st.mu.Lock()
	st.stats.Batches++
	st.stats.Events += int64(len(b.Events))
	st.stats.LastSeq, st.stats.HasSeq = seq, true
	if replayed {
		st.stats.ReplayedBatches++
	}
	st.mu.Unlock()
	if f := st.sub.opts.Applied; f != nil {
		f(st.ref, b, replayed)
	}
}

// startRecovery fetches batches from seq from on, holding pending (live
// messages that arrived after the gap) until the replay answers.
func (st *stream) startRecovery(ctx context.Context, from uint64, pending []message, why string) {
	st.replayGen++
	if why != "continued" {
		st.rounds = 0
	}
	st.recovering, st.recoverFrom, st.pending = true, from, pending
	st.pendingBytes = 0
	for _, m := range pending {
		st.pendingBytes += m.size
	}
	if why == "join" || why == "late join" {
		st.joinTried = true
	}
	st.isRecovering.Store(true)
	st.mu.Lock()
	st.stats.Replays++
	st.mu.Unlock()
	endpoint, gen := st.replay, st.replayGen
	go func() {
		res := replayResult{gen: gen, from: from}
		select {
		case st.sub.replaySlots <- struct{}{}:
			res.batches, res.err = fetchReplay(ctx, st.sub.zctx, endpoint, from, st.sub.opts.ReplayTimeout, st.sub.opts.ReplayIdle, st.sub.opts.ReplayMaxBatches, st.sub.opts.ReplayMaxBytes, max(st.sub.opts.MaxMessageBytes, -1))
			<-st.sub.replaySlots
		case <-ctx.Done():
			res.err = ctx.Err()
		}
		if res.err != nil && ctx.Err() == nil {
			res.err = fmt.Errorf("%s replay from seq %d: %w", why, from, res.err)
		}
		select {
		case st.replayDone <- res:
		case <-ctx.Done(): // the stream has stopped reading
		}
	}()
}

// onReplay applies a replay's batches that precede the pending live
// messages, applies the gap policy to whatever it could not fill, then
// drains the pending messages.
func (st *stream) onReplay(ctx context.Context, r replayResult) {
	if !st.recovering || r.gen != st.replayGen {
		st.mu.Lock()
		st.stats.StaleReplays++
		st.mu.Unlock()
		st.problem(fmt.Errorf("replay from seq %d answered after it was given up (replay %d, current %d): %d batches dropped", r.from, r.gen, st.replayGen, len(r.batches)), false)
		return
	}
	if r.from != st.recoverFrom {
		brokenInvariant(fmt.Sprintf("replay %d answered from seq %d for a recovery from seq %d", r.gen, r.from, st.recoverFrom))
	}
	st.recovering = false
	st.isRecovering.Store(false)
	pending := st.pending
	st.pending, st.pendingBytes = nil, 0
	limit := ^uint64(0)
	if len(pending) > 0 {
		limit = pending[0].seq
	}
	cut := errors.Is(r.err, errReplayCut)
	if r.err != nil && ctx.Err() != nil {
		st.drain(ctx, pending)
		return
	}
	if r.err != nil && !cut {
		st.mu.Lock()
		st.stats.ReplayFailures++
		st.mu.Unlock()
		st.backoff = min(max(2*st.backoff, st.sub.opts.ReplayBackoff), 30*time.Second)
		st.backoffUntil = time.Now().Add(st.backoff)
		st.problem(r.err, false)
	} else {
		st.backoff = 0
	}
	// When the answer skipped seqs after it had started, or stopped short,
	// the engine still held what is missing (its ROUTER dropped messages at
	// its send high-water mark): apply the contiguous part and ask again
	// from the first missing seq. Only what the engine no longer buffers,
	// the seqs before its answer's first, are lost.
	if n := st.contiguous(r, limit); n > 0 && st.rounds < maxReplayRounds {
		after := r.batches[n-1].seq + 1
		// A skip right after the contiguous part is a hole even when
		// the answer resumes at or past limit: the engine still holds
		// [after, limit), since it went on to publish limit.
		hole := n < len(r.batches) && r.batches[n].seq != after
		if (hole || cut) && after < limit {
			next := r.from
			for _, b := range r.batches[:n] {
				if b.seq > next { // the engine's buffer starts after what we asked for
					st.lost(next, b.seq, r.from)
				}
				st.applyReplayed(b)
				next = b.seq + 1
			}
			st.rounds++
			st.mu.Lock()
			st.stats.ReplayContinuations++
			st.mu.Unlock()
			st.startRecovery(ctx, next, pending, "continued")
			return
		}
	}
	st.rounds = 0
	next := r.from
	for _, b := range r.batches {
		if b.seq < next {
			continue
		}
		if b.seq >= limit {
			break // the live stream takes over; what is missing before it is below
		}
		if b.seq > next {
			end := b.seq
			if next == r.from {
				st.lost(next, end, r.from)
			} else {
				st.unrecoverable(next, end, "the engine's replay answer skipped them")
			}
			next = end
		}
		st.applyReplayed(b)
		next = b.seq + 1
	}
	if limit != ^uint64(0) {
		switch {
		case next < limit && st.hasExpected:
			reason := "replay did not reach the live stream"
			if r.err != nil {
				reason = "replay failed"
			}
			st.unrecoverable(next, limit, reason)
			st.expected = limit
		case next < limit && limit > 0:
			// Nothing of this process was learned before the first live
			// message: a late join whose history is gone.
			st.mu.Lock()
			st.stats.JoinedAtSeq = limit
			st.mu.Unlock()
		case st.hasExpected:
			st.expected = limit
		}
	}
	st.drain(ctx, pending)
}

// maxReplayRounds bounds how many times one recovery asks again for what
// an answer dropped: 64 rounds of libzmq's default 1,000-message send limit
// cover vLLM's default 10,000-step buffer several times over.
const maxReplayRounds = 64

// contiguous returns how many of r's batches, from the first, follow each
// other without a hole and precede limit. A hole before the first batch
// (the engine's buffer starts later) does not end the run: those seqs are
// gone, not dropped.
func (st *stream) contiguous(r replayResult, limit uint64) int {
	for i, b := range r.batches {
		if b.seq >= limit || i > 0 && b.seq != r.batches[i-1].seq+1 {
			return i
		}
	}
	return len(r.batches)
}

// lost handles seqs [from, to) that the engine's buffer no longer holds, at
// the start of an answer asked from seq asked: a late join learns the
// worker's history starts at to; otherwise the gap policy applies.
func (st *stream) lost(from, to, asked uint64) {
	if !st.hasExpected && from == asked {
		st.mu.Lock()
		st.stats.JoinedAtSeq = to
		st.mu.Unlock()
		return
	}
	st.unrecoverable(from, to, "the engine's replay buffer no longer holds them")
}

// applyReplayed decodes and applies one replayed batch and advances
// expected past it.
func (st *stream) applyReplayed(b replayedBatch) {
	m := message{seq: b.seq, at: time.Now(), sum: xxh3.Hash(b.payload)}
	if st.dec == nil {
		st.dec = events.NewDecoder()
	}
	if err := st.dec.Decode(b.payload, &st.replayBatch); err != nil {
		m.decodeErr = err
		st.apply(m)
		return
	}
	st.remember(b.seq, m.sum)
	st.expected, st.hasExpected = b.seq+1, true
	st.applyBatch(b.seq, &st.replayBatch, true)
}

// drain processes held live messages in order, re-holding the rest if one
// of them starts another recovery.
func (st *stream) drain(ctx context.Context, msgs []message) {
	for i, m := range msgs {
		if st.recovering {
			st.pending = append(st.pending, msgs[i:]...)
			for _, m := range msgs[i:] {
				st.pendingBytes += m.size
			}
			return
		}
		st.process(ctx, m)
	}
}

// unrecoverable applies the gap policy to the lost seqs [from, to).
func (st *stream) unrecoverable(from, to uint64, reason string) {
	msg := fmt.Sprintf("lost batches %d..%d (%s)", from, to-1, reason)
	st.mu.Lock()
	st.stats.UnrecoveredGaps++
	st.stats.UnsyncedReason = msg
	st.mu.Unlock()
	switch st.sub.opts.GapPolicy {
	case events.GapKeep:
		st.unsynced.Store(true)
		st.sub.opts.Logger.Warn("kv events lost and not replayed; worker marked unsynced", "worker", st.ref.String(), "detail", msg)
	default:
		st.sink.Reset(msg)
		st.unsynced.Store(false)
		st.sub.opts.Logger.Warn("kv events lost and not replayed; worker reset", "worker", st.ref.String(), "detail", msg)
	}
}

// releasePending returns held batches to the pool at shutdown.
func (st *stream) releasePending() {
	for _, m := range st.pending {
		st.sub.putBatch(m.batch)
	}
	st.pending = nil
}

// problem counts and logs (rate-limited) a skipped message or event.
func (st *stream) problem(err error, decode bool) {
	now := time.Now()
	st.mu.Lock()
	if decode {
		st.stats.DecodeErrors++
	} else {
		st.stats.ApplyErrors++
	}
	st.stats.LastError = err.Error()
	emit, suppressed := st.log.Allow(now, st.sub.opts.LogEvery)
	st.mu.Unlock()
	if emit {
		st.sub.opts.Logger.Warn("kv event problem", "worker", st.ref.String(), "err", err, "suppressed", suppressed)
	}
}

// evalHealth recomputes the stream's health at now and returns it.
func (st *stream) evalHealth(now time.Time, o *SubscriberOptions) events.Health {
	stale := false
	if st.monitored && !st.connected.Load() && o.StaleAfterDisconnect > 0 {
		if since := st.disconnected.Load(); since != 0 && now.Sub(time.Unix(0, since)) >= o.StaleAfterDisconnect {
			stale = true
		}
	}
	last := st.lastMessage.Load()
	if o.StaleAfterSilence > 0 && last != 0 && now.Sub(time.Unix(0, last)) >= o.StaleAfterSilence {
		stale = true
	}
	switch {
	case stale:
		return events.HealthStale
	case st.inConflict.Load():
		return events.HealthConflict
	case st.isRecovering.Load():
		return events.HealthRecovering
	case st.unsynced.Load():
		return events.HealthUnsynced
	case st.lastBad.Load() != 0 && now.Sub(time.Unix(0, st.lastBad.Load())) < degradedFor:
		return events.HealthDegraded
	case last != 0 || (st.monitored && st.connected.Load()):
		return events.HealthOK
	}
	return events.HealthUnknown
}

// refreshHealth re-evaluates health now; the stream and the receiver call
// it on every change they make, the health checker on a timer.
func (st *stream) refreshHealth() {
	now := time.Now()
	st.setHealth(st.evalHealth(now, &st.sub.opts), now)
}

// setHealth stores h, counting and logging transitions into and out of
// STALE. Several goroutines call it; mu orders them.
func (st *stream) setHealth(h events.Health, now time.Time) {
	st.mu.Lock()
	old := st.stats.Health
	if old == h {
		st.mu.Unlock()
		return
	}
	st.stats.Health = h
	st.health.Store(h)
	if h == events.HealthStale {
		st.stats.StaleSince = now
		st.stats.StaleTransitions++
	} else if old == events.HealthStale {
		st.stats.StaleSince = time.Time{}
	}
	st.mu.Unlock()
	if h == events.HealthStale {
		st.sub.opts.Logger.Warn("worker stale: left out of Score answers", "worker", st.ref.String())
	} else if old == events.HealthStale {
		st.sub.opts.Logger.Info("worker back from stale", "worker", st.ref.String(), "health", h.String())
	}
}

// snapshot returns the stream's stats.
func (st *stream) snapshot() events.WorkerStats {
	st.mu.Lock()
	s := st.stats
	st.mu.Unlock()
	s.Backlog = len(st.in)
	s.Connected = st.connected.Load()
	s.HealthReason = st.healthReason(&s, time.Now())
	return s
}

// healthReason says, for an operator, why s.Health is not OK.
func (st *stream) healthReason(s *events.WorkerStats, now time.Time) string {
	switch s.Health {
	case events.HealthStale:
		if st.monitored && !s.Connected {
			return "no connection to the engine's event socket since " + s.StaleSince.UTC().Format(time.RFC3339)
		}
		return "no message since " + s.LastMessage.UTC().Format(time.RFC3339)
	case events.HealthConflict:
		return s.ConflictReason
	case events.HealthRecovering:
		return "a replay is filling lost events"
	case events.HealthUnsynced:
		return "events were lost beyond replay and kept (gap_policy keep): " + s.UnsyncedReason
	case events.HealthDegraded:
		return fmt.Sprintf("events failed to decode or apply within the last %v; last: %s", degradedFor, s.LastError)
	}
	return ""
}

// degradedFor is how long after an event that could not be decoded or
// applied the worker shows as DEGRADED.
const degradedFor = time.Minute

// recentSeqs is how many applied messages a stream remembers to recognise
// a repeated one.
const recentSeqs = 64

// remember records an applied message's seq and payload sum.
func (st *stream) remember(seq, sum uint64) {
	r := &st.recent[seq%recentSeqs]
	r.seq, r.sum, r.ok = seq, sum, true
}

// duplicate reports whether m repeats a recently applied message: the
// same seq with the same payload. A seq that went back with another
// payload is a restart (or a second publisher), not a duplicate.
func (st *stream) duplicate(m message) bool {
	if !st.hasExpected || m.seq >= st.expected || st.expected-m.seq > recentSeqs || m.decodeErr != nil {
		return false
	}
	r := &st.recent[m.seq%recentSeqs]
	return r.ok && r.seq == m.seq && r.sum == m.sum
}

// Two publishers on one topic interleave their seqs: after one's seq
// "went back" (read as a restart), the other's next message continues the
// sequence from before. continuesBack reports such a message: within
// conflictWindow seqs of where the stream was before it went back, and
// conflictAfter of it.
const (
	conflictWindow = 64
	conflictAfter  = 10 * time.Second
)

func (st *stream) continuesBack(seq uint64, at time.Time) bool {
	return !st.backAt.IsZero() && at.Sub(st.backAt) < conflictAfter &&
		seq >= st.back && seq < st.back+conflictWindow && seq > st.expected+conflictWindow
}

// bounces records that the seq went back at at (and where from, for
// continuesBack), and reports whether it is the third time within
// conflictAfter: two publishers whose seqs are too close for
// continuesBack to tell apart, not an engine restarting three times.
func (st *stream) bounces(at time.Time) bool {
	st.back, st.backAt = st.expected, at
	if st.backFirst.IsZero() || at.Sub(st.backFirst) >= conflictAfter {
		st.backFirst, st.backs = at, 0
	}
	st.backs++
	return st.backs >= 3
}

// startConflict enters the conflict state on m, the message that showed
// two publishers: the worker is cleared once (its events cannot be
// ordered), and nothing is applied until one publisher stops.
func (st *stream) startConflict(m message) {
	st.conflict = true
	st.inConflict.Store(true)
	st.next = [2]uint64{m.seq + 1, st.expected}
	st.last = [2]time.Time{m.at, m.at}
	reason := fmt.Sprintf("two publishers on topic %q: seqs interleave (one near %d, one near %d); nothing is applied until one of them stops for %v", st.stats.Topic, m.seq, st.expected, st.sub.opts.ConflictQuiet)
	st.mu.Lock()
	st.stats.Conflicts++
	st.stats.ConflictReason = reason
	st.mu.Unlock()
	st.sink.Reset(reason)
	st.unsynced.Store(false)
	st.sub.putBatch(m.batch)
	st.sub.opts.Logger.Warn("two publishers on one topic: worker cleared and left out of answers", "worker", st.ref.String(), "detail", reason)
}

// inConflictMessage follows both publishers' seqs and drops m; when one of
// them has been silent for ConflictQuiet, the stream follows the other
// from its next message on, as a worker joining late.
func (st *stream) inConflictMessage(m message) {
	i := 0
	if dist(m.seq, st.next[1]) < dist(m.seq, st.next[0]) {
		i = 1
	}
	st.next[i], st.last[i] = m.seq+1, m.at
	st.sub.putBatch(m.batch)
	st.mu.Lock()
	st.stats.Dropped++
	st.mu.Unlock()
	if m.at.Sub(st.last[1-i]) < st.sub.opts.ConflictQuiet {
		return
	}
	st.conflict = false
	st.inConflict.Store(false)
	st.back, st.backAt, st.backs, st.backFirst = 0, time.Time{}, 0, time.Time{}
	st.hasExpected, st.joinTried = false, false
	st.sink.Reset("second publisher stopped: relearning the worker")
	st.sub.opts.Logger.Info("conflict over: one publisher left on the topic", "worker", st.ref.String(), "seq", m.seq)
}

func dist(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// brokenInvariant is the one place the transport panics: on a state its
// invariants rule out, which no input can cause.
func brokenInvariant(what string) {
	panic("zmq: broken invariant: " + what)
}
