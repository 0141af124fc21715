package zmq

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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

// replayResult is what a replay fetch hands back. gen is the stream's replay
// generation at its start: only the current recovery's result is accepted; a
// given-up one's is dropped and counted, even if a later one asked the same seq.
type replayResult struct {
	gen     uint64
	from    uint64
	batches []replayedBatch
	err     error
}

// stream is one worker's ordered event pipeline: seq tracking, replay of
// gaps, and batches applied to the worker's events.Sink. Fields "owned by
// run" are touched only by its run goroutine; mu guards stats; the atomics
// are written by their owners and read by the health checker and Score.
type stream struct {
	sub    *Subscriber
	ref    events.WorkerRef
	sink   events.Sink
	replay string // replay endpoint, "" for none
	topic  string // pull mode: the subscription prefix

	in         chan message
	queued     atomic.Int64 // payload bytes in in
	replayDone chan replayResult
	rxEpoch    []byte // last SGLang epoch seen, owned by the one receiver
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
	retries     int    // failed answers of the current recovery asked again
	// recent are the last applied messages by seq mod len, to spot repeats.
	recent [recentSeqs]struct {
		seq, sum uint64
		ok       bool
	}
	// back is the expected seq before seq last went back, and when: a message
	// continuing it is a second publisher. backs counts backs since backFirst.
	back      uint64
	backAt    time.Time
	backs     int
	backFirst time.Time
	// conflict: two publishers interleave; next and last are each one's next
	// seq and last message time.
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

	mu    sync.Mutex // guards stats, log, typeLog and mediumLog
	stats events.WorkerStats
	log   lograte.Limiter
	// typeLog and mediumLog rate-limit the reports of unknown event types
	// and media apart from problems: neither hides the other.
	typeLog, mediumLog lograte.Limiter
}

func newStream(sub *Subscriber, ref events.WorkerRef, endpoint, topic, replay string, sink events.Sink, monitored bool) *stream {
	st := &stream{
		sub:         sub,
		ref:         ref,
		sink:        sink,
		replay:      replay,
		topic:       topic,
		in:          make(chan message, sub.opts.QueueSize),
		replayDone:  make(chan replayResult, 1),
		connectedCh: make(chan struct{}, 1),
		monitored:   monitored,
		stats:       events.WorkerStats{Worker: ref, Endpoint: endpoint, Topic: topic, ReplayEndpoint: replay},
	}
	st.disconnected.Store(time.Now().UnixNano())
	return st
}

// run is the stream's goroutine. Joining a running engine, it replays from
// the oldest buffered batch (a join). In pull mode the join waits for the
// connection, so an engine started later is asked once up and a batch sent
// before the subscription arrived is in the answer; an empty join is asked
// again rejoinAfter later. In push mode it joins at once.
func (st *stream) run(ctx context.Context) {
	if st.replay != "" && !st.monitored {
		st.startRecovery(ctx, 0, nil, "join", 0)
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
				st.startRecovery(ctx, 0, nil, "join", 0)
			case st.resuming:
				// Restored from a checkpoint: fetch what came since.
				st.resuming = false
				st.startRecovery(ctx, st.expected, nil, "resume", 0)
			}
		case <-rejoin.C:
			if !st.hasExpected && !st.recovering {
				st.startRecovery(ctx, 0, nil, "join", 0)
			}
		}
		st.refreshHealth()
	}
}

// rejoinAfter exceeds the time a subscription takes to reach a local engine.
const rejoinAfter = time.Second

// enqueue hands m to the stream without blocking; a full queue drops and
// counts it, and the seq gap is recovered like any other.
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
	st.count(&st.stats.Dropped)
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

// process applies one live message in seq order, replaying a gap it reveals.
// Run goroutine only, not recovering.
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
			st.startRecovery(ctx, 0, []message{m}, "late join", 0)
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
			st.startRecovery(ctx, st.expected, []message{m}, "gap", 0)
			return
		}
		reason := "no replay endpoint"
		if st.replay != "" {
			reason = "replay backing off after a failure"
		}
		st.unrecoverable(st.expected, m.seq, reason)
	case st.duplicate(m):
		st.count(&st.stats.Duplicates)
		st.sub.putBatch(m.batch)
		return
	case st.bounces(m.at):
		st.startConflict(m)
		return
	default: // seq went backwards: a new engine process
		st.restart(fmt.Sprintf("seq went back from %d to %d: engine restarted", st.expected-1, m.seq))
		if m.seq > 0 && st.replay != "" && time.Now().After(st.backoffUntil) {
			st.startRecovery(ctx, 0, []message{m}, "restart", 0)
			return
		}
	}
	st.apply(m)
}

// restart resets the worker after its engine restarted.
func (st *stream) restart(reason string) {
	st.count(&st.stats.Restarts)
	st.sink.Reset(reason)
	st.unsynced.Store(false)
	st.hasExpected = false
	st.sub.opts.Logger.Warn("engine restart detected; worker cleared", "worker", st.ref.String(), "reason", reason)
}

// apply applies a decoded (or undecodable) message and advances expected;
// LastSeq shows it only once applied (or counted as undecodable).
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

// applyBatch hands batch seq to the sink, then counts it in the stats.
func (st *stream) applyBatch(seq uint64, b *events.Batch, replayed bool) {
	if b.HasDPRank && b.DPRank != st.ref.DPRank && st.monitored {
		st.rankMismatches.Add(1)
		st.problem(fmt.Errorf("seq %d: batch from data_parallel_rank %d on the endpoint configured for rank %d", seq, b.DPRank, st.ref.DPRank), false)
	}
	if n, name := st.sub.opts.Tiers.Classify(b); n > 0 || b.UnknownEvents > 0 {
		st.unknowns(seq, b, n, name)
	}
	for i := range b.Events {
		if b.Events[i].Kind == events.KindAllBlocksCleared {
			// Starting from nothing: earlier losses no longer matter.
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

// brokenInvariant is the transport's one panic: a state no input can cause.
func brokenInvariant(what string) {
	panic("zmq: broken invariant: " + what)
}
