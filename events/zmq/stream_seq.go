package zmq

import (
	"fmt"
	"time"
)

// recentSeqs is how many applied messages a stream remembers.
const recentSeqs = 64

// remember records an applied message's seq and payload sum.
func (st *stream) remember(seq, sum uint64) {
	r := &st.recent[seq%recentSeqs]
	r.seq, r.sum, r.ok = seq, sum, true
}

// duplicate reports whether m repeats a recent message, seq and payload (a
// seq going back with another payload is a restart or a second publisher).
func (st *stream) duplicate(m message) bool {
	if !st.hasExpected || m.seq >= st.expected || st.expected-m.seq > recentSeqs || m.decodeErr != nil {
		return false
	}
	r := &st.recent[m.seq%recentSeqs]
	return r.ok && r.seq == m.seq && r.sum == m.sum
}

// Two publishers on one topic interleave: after one's seq "went back" (read
// as a restart), the other's continues the old sequence. continuesBack
// reports such a message: within conflictWindow seqs and conflictAfter of it.
const (
	conflictWindow = 64
	conflictAfter  = 10 * time.Second
)

func (st *stream) continuesBack(seq uint64, at time.Time) bool {
	return !st.backAt.IsZero() && at.Sub(st.backAt) < conflictAfter &&
		seq >= st.back && seq < st.back+conflictWindow && seq > st.expected+conflictWindow
}

// bounces records that the seq went back at at, and reports a third time
// within conflictAfter: two publishers too close for continuesBack.
func (st *stream) bounces(at time.Time) bool {
	st.back, st.backAt = st.expected, at
	if st.backFirst.IsZero() || at.Sub(st.backFirst) >= conflictAfter {
		st.backFirst, st.backs = at, 0
	}
	st.backs++
	return st.backs >= 3
}

// startConflict enters the conflict state on m: the worker is cleared once
// and nothing is applied until one publisher stops.
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

// inConflictMessage follows both publishers' seqs and drops m; once one has
// been silent for ConflictQuiet, the stream follows the other as a late join.
func (st *stream) inConflictMessage(m message) {
	i := 0
	if dist(m.seq, st.next[1]) < dist(m.seq, st.next[0]) {
		i = 1
	}
	st.next[i], st.last[i] = m.seq+1, m.at
	st.sub.putBatch(m.batch)
	st.count(&st.stats.Dropped)
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
