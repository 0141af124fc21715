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

// brokenInvariant is the one place the transport panics: on a state its
// invariants rule out, which no input can cause.
func brokenInvariant(what string) {
	panic("zmq: broken invariant: " + what)
}
