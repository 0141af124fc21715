package zmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/events"
)

// startRecovery fetches batches from seq from on, after delay, holding
// pending (live messages that arrived after the gap) until the replay
// answers.
func (st *stream) startRecovery(ctx context.Context, from uint64, pending []message, why string, delay time.Duration) {
	st.replayGen++
	if why != "continued" && why != "retry" {
		st.rounds, st.retries = 0, 0
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
	st.count(&st.stats.Replays)
	endpoint, gen := st.replay, st.replayGen
	go func() {
		res := replayResult{gen: gen, from: from}
		wait := time.NewTimer(delay)
		defer wait.Stop()
		select {
		case <-wait.C:
			select {
			case st.sub.replaySlots <- struct{}{}:
				res.batches, res.err = fetchReplay(ctx, st.sub.zctx, endpoint, from, st.sub.opts.ReplayTimeout, st.sub.opts.ReplayIdle, st.sub.opts.ReplayMaxBatches, st.sub.opts.ReplayMaxBytes, max(st.sub.opts.MaxMessageBytes, -1))
				<-st.sub.replaySlots
			case <-ctx.Done():
				res.err = ctx.Err()
			}
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

// onReplay applies the replayed batches before the pending live messages,
// the gap policy to what it could not fill, then drains the pending ones.
func (st *stream) onReplay(ctx context.Context, r replayResult) {
	if !st.recovering || r.gen != st.replayGen {
		st.count(&st.stats.StaleReplays)
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
	failed := r.err != nil && !cut
	if failed {
		st.count(&st.stats.ReplayFailures)
		st.backoff = min(max(2*st.backoff, st.sub.opts.ReplayBackoff), 30*time.Second)
		st.backoffUntil = time.Now().Add(st.backoff)
		st.problem(r.err, false)
	} else {
		st.backoff = 0
	}
	// An answer that skipped seqs after it started, or stopped short, lost
	// them at the engine's send HWM (it still holds them): apply the
	// contiguous part and ask again from the first missing seq. Only seqs
	// before the answer's first are gone. A failed answer (a slow or cut
	// link, an engine busy between steps) is asked again after the backoff,
	// up to ReplayRetries times, the live batches held meanwhile: the
	// engine may still buffer what it did not send.
	n := st.contiguous(r, limit)
	after := r.from
	if n > 0 {
		after = r.batches[n-1].seq + 1
	}
	// A skip after the contiguous part is a hole even past limit: the
	// engine still holds [after, limit).
	hole := n > 0 && n < len(r.batches) && r.batches[n].seq != after
	retry := failed && st.retries < st.sub.opts.ReplayRetries && (n > 0 || len(r.batches) == 0)
	if after < limit && (retry || n > 0 && st.rounds < maxReplayRounds && (hole || cut)) {
		next := r.from
		for _, b := range r.batches[:n] {
			if b.seq > next { // the engine's buffer starts after what we asked for
				st.lost(next, b.seq, r.from)
			}
			st.applyReplayed(b)
			next = b.seq + 1
		}
		if retry {
			st.retries++
			st.sub.opts.Logger.Info("replay failed: asking again", "worker", st.ref.String(), "from", next, "attempt", st.retries+1, "after", st.backoff)
			st.startRecovery(ctx, next, pending, "retry", st.backoff)
			return
		}
		st.rounds++
		st.count(&st.stats.ReplayContinuations)
		st.startRecovery(ctx, next, pending, "continued", 0)
		return
	}
	st.rounds, st.retries = 0, 0
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
			// A late join whose history is gone.
			st.mu.Lock()
			st.stats.JoinedAtSeq = limit
			st.mu.Unlock()
		case st.hasExpected && limit >= r.from:
			st.expected = limit
		}
		// limit < r.from: the live messages that waited went back before
		// what was asked for (the engine restarted, say while an agent
		// restored from its checkpoint was down); process judges them as
		// it judges any seq that goes back.
	}
	st.drain(ctx, pending)
}

// maxReplayRounds bounds one recovery's asks again: 64 rounds of libzmq's
// 1,000-message send limit cover vLLM's 10,000-step buffer several times.
const maxReplayRounds = 64

// contiguous returns how many of r's first batches follow each other and
// precede limit (a hole before the first is gone, not dropped).
func (st *stream) contiguous(r replayResult, limit uint64) int {
	for i, b := range r.batches {
		if b.seq >= limit || i > 0 && b.seq != r.batches[i-1].seq+1 {
			return i
		}
	}
	return len(r.batches)
}

// lost handles seqs [from, to) the engine no longer buffers, at the start of
// an answer from asked: a late join starts at to, else the gap policy applies.
func (st *stream) lost(from, to, asked uint64) {
	if !st.hasExpected && from == asked {
		st.mu.Lock()
		st.stats.JoinedAtSeq = to
		st.mu.Unlock()
		return
	}
	st.unrecoverable(from, to, "the engine's replay buffer no longer holds them")
}

// applyReplayed decodes and applies one replayed batch.
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

// drain processes held messages, re-holding the rest if one starts a recovery.
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
