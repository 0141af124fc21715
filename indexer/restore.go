package indexer

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// Restore replaces the keyed worker's state with the snapshot that next
// returns segment by segment, until io.EOF, and makes its Seq the worker's
// delta seq. Every key, placeholders included, is created where the
// snapshot says it attaches. Bad segments (see segOrder and keyOrder),
// invalid counts or a wrong digest are ErrBadSnapshot, the worker left as
// it was. A worker fed engine events refuses (ErrWorkerKind).
//
// A worker that holds blocks is replaced in two passes: check everything
// with no lock held, then clear and build under the mutex. An empty worker
// (a replica's first sync and every resync) is built in one pass, each
// segment checked and built under the mutex as it arrives; a failed check
// clears what was built, and a budget eviction or another call changing
// the worker between segments ends it with an error, the worker cleared.
// Cost: BenchmarkRestore and BenchmarkRestoreEmpty.
func (w *Worker) Restore(next func() (*SnapshotSegment, error)) error {
	if !w.info.Keyed {
		return fmt.Errorf("%w: worker %s is fed engine events (no restore)", ErrWorkerKind, w.info.Ref)
	}
	w.mu.Lock()
	gone, empty := w.gone, w.engine.Len() == 0 && w.sideRes == 0
	w.mu.Unlock()
	if gone {
		return fmt.Errorf("%w: %s (no restore)", ErrRemovedWorker, w.info.Ref)
	}
	if empty {
		return w.restoreEmpty(next)
	}
	st, err := readSnapshot(next)
	if err != nil {
		return fmt.Errorf("indexer: restore worker %s: %w", w.info.Ref, err)
	}
	w.mu.Lock()
	if w.gone {
		w.mu.Unlock()
		return fmt.Errorf("%w: %s (snapshot of %d keys not restored)", ErrRemovedWorker, w.info.Ref, len(st.keys))
	}
	before := w.res
	w.clearLocked()
	st.buildLocked(w)
	w.deltaSeq = st.seq
	w.unlockThen(before, w.restoredLocked("snapshot"))
	return nil
}

// errRestoreChanged: the worker changed between two segments.
var errRestoreChanged = errors.New("the worker changed during the restore (a budget eviction, or another call)")

// restoreEmpty is Restore into a worker that holds nothing, in one pass.
func (w *Worker) restoreEmpty(next func() (*SnapshotSegment, error)) error {
	rs := restoreStream{w: w}
	err := rs.run(next)
	w.mu.Lock()
	if err == nil && w.gone {
		err = fmt.Errorf("%w: %s (restore of %d keys undone)", ErrRemovedWorker, w.info.Ref, rs.keys)
	}
	before := w.res
	if err != nil {
		if !w.gone {
			w.clearLocked() // back to empty, as it was
		}
		w.unlockThen(before, after{})
		if errors.Is(err, ErrRemovedWorker) {
			return err
		}
		return fmt.Errorf("indexer: restore worker %s: %w", w.info.Ref, err)
	}
	w.deltaSeq = rs.o.first.seq
	w.unlockThen(before, w.restoredLocked("snapshot"))
	return nil
}

// restoreStream is the state of a one-pass restore between segments.
type restoreStream struct {
	w         *Worker
	o         segOrder
	keys      int    // keys built
	digest    uint64 // of the keys built
	prev      Key    // the last key built and its place; prevHole: a placeholder.
	prevLoc   loc
	havePrev  bool
	prevHole  bool
	holes     map[Key]loc // placeholders built (held keys are in the engine map)
	carry     []SnapshotKey
	scratch   []SnapshotKey
	sc        *sideCheck // the layout's side groups and the side keys' digest
	entries   int        // the engine map's length when the mutex was last released
	evictions int64      // the worker's evictions then
}

// run reads, checks and builds every segment, and reports the first
// problem.
func (rs *restoreStream) run(next func() (*SnapshotSegment, error)) error {
	rs.evictions = rs.w.c.evictions.Load()
	rs.o = segOrder{bad: ErrBadSnapshot, what: "snapshot", maxKeys: SnapshotSegmentKeys}
	if err := read(&rs.o, next, (*SnapshotSegment).head, rs.segment); err != nil {
		return err
	}
	switch {
	case len(rs.carry) > 0:
		return fmt.Errorf("%w: it ends with a placeholder (%#016x)", ErrBadSnapshot, uint64(rs.carry[len(rs.carry)-1].Key))
	case rs.prevHole:
		return fmt.Errorf("%w: it ends with a placeholder (%#016x)", ErrBadSnapshot, uint64(rs.prev))
	}
	return rs.o.checkDigest(rs.digest + rs.sc.digest)
}

// segment checks and builds one segment under the worker's mutex, unless
// the worker changed since the one before.
func (rs *restoreStream) segment(seg *SnapshotSegment) error {
	w := rs.w
	w.mu.Lock()
	before := w.res
	var err error
	switch {
	case w.gone:
		err = fmt.Errorf("%w: %s (restore of %d keys undone)", ErrRemovedWorker, w.info.Ref, rs.keys)
	case w.engine.Len() != rs.entries || w.c.evictions.Load() != rs.evictions:
		err = errRestoreChanged
	default:
		if seg.Part == 0 {
			// Sized once, up to a bound, as a grown table.
			w.engine.ReserveGrown(int(min(seg.Total, restoreReserve)))
		}
		if why := layoutAndSide(seg, &rs.sc); why != "" {
			err = fmt.Errorf("%w: segment %d: %s", ErrBadSnapshot, seg.Part, why)
			break
		}
		if seg.Part == 0 {
			w.adoptLayoutLocked(seg.Groups)
		}
		w.restoreSideKeysLocked(seg.Side)
		err = rs.segmentLocked(seg)
		rs.entries = w.engine.Len()
	}
	w.unlockThen(before, after{}) // publishes the segment's nodes and releases them
	return err
}

// segmentLocked builds one segment's keys after those carried from the one
// before, and carries its trailing placeholders to the next.
func (rs *restoreStream) segmentLocked(seg *SnapshotSegment) error {
	keys := seg.Keys
	end := len(keys)
	if !seg.Last {
		for end > 0 && keys[end-1].Blocks == 0 {
			end--
		}
	}
	if end == 0 && !seg.Last {
		rs.carry = append(rs.carry, keys...)
		return nil
	}
	run := keys[:end]
	if len(rs.carry) > 0 {
		rs.scratch = append(append(rs.scratch[:0], rs.carry...), run...)
		run = rs.scratch
	}
	if err := rs.buildLocked(seg.Part, run); err != nil {
		return err
	}
	rs.carry = append(rs.carry[:0], keys[end:]...)
	return nil
}

// buildLocked checks and builds run, the keys of segment part.
func (rs *restoreStream) buildLocked(part uint32, run []SnapshotKey) error {
	w := rs.w
	c := &w.cur
	id := uint32(w.id)
	chainEnd := 0
	for i := range run {
		sk := &run[i]
		bad := func(why string) error { // rs.keys: the key's index in the snapshot
			return fmt.Errorf("%w: key %d (%#016x), in segment %d or the one before: %s", ErrBadSnapshot, rs.keys, uint64(sk.Key), part, why)
		}
		kc := sk.counts()
		if !kc.valid() {
			return bad(sk.whyCounts())
		}
		var under loc // the key before (a chain), a held key, a placeholder, or top level
		underPrev := sk.HasParent && rs.havePrev && rs.prev == sk.Parent
		switch {
		case !sk.HasParent:
		case underPrev:
			under = rs.prevLoc
		default:
			if slot, ok := w.engine.Get(uint64(sk.Parent)); ok {
				under = w.locOf(w.entry(slot))
			} else if l, ok := rs.holes[sk.Parent]; ok {
				under = l
			} else {
				return bad(whyParentLater(sk.Parent))
			}
		}
		if rs.prevHole && !underPrev {
			return bad(whyHoleLone)
		}
		if _, ok := w.engine.Get(uint64(sk.Key)); ok {
			return bad(whyTwice)
		}
		if _, ok := rs.holes[sk.Key]; ok {
			return bad(whyTwice)
		}
		if i >= chainEnd { // the chain from i sizes the nodes it creates
			j := i + 1
			for j < len(run) && run[j].HasParent && run[j].Parent == run[j-1].Key {
				j++
			}
			chainEnd = j
		}
		media := kc.media()
		var set *holders.Set
		if media != 0 {
			set = w.ix.single(id, media)
		}
		var l loc
		var fresh bool
		hint := (chainEnd - i + 1) / 2 // newNode doubles it
		if !sk.HasParent {
			l, fresh = c.top(sk.Key, set, hint)
		} else {
			l, fresh = c.next(under, sk.Key, set, hint)
		}
		rs.prev, rs.prevLoc, rs.havePrev, rs.prevHole = sk.Key, l, true, media == 0
		rs.keys++
		if media == 0 {
			if rs.holes == nil {
				rs.holes = make(map[Key]loc)
			}
			rs.holes[sk.Key] = l
			continue
		}
		if !fresh {
			c.change(l, holders.Op{Worker: id, Set: media})
		}
		w.restoreKeyLocked(sk.Key, l, &kc)
		rs.digest += digestTerm(sk.Key, media)
	}
	return nil
}

// restoreState is a snapshot read and checked; parent[i] is key i's
// parent's index (-1 at top level).
type restoreState struct {
	seq    uint64
	keys   []SnapshotKey
	parent []int32
	held   int // keys that are not placeholders
	layout []Group
	side   []SideKey
}

func (s *SnapshotSegment) head() segHead {
	return segHead{part: s.Part, seq: s.Seq, total: s.Total, last: s.Last, digest: s.Digest, keys: len(s.Keys),
		side: len(s.Side), totalSide: s.TotalSide, state: len(s.Groups) > 0}
}

// layoutAndSide checks a snapshot segment's layout (part 0) and side keys
// with sc (made from part 0's layout), making sc first; it returns why
// they do not fit, "" if they do.
func layoutAndSide(seg *SnapshotSegment, sc **sideCheck) string {
	if seg.Part == 0 {
		if why := checkLayout(seg.Groups); why != "" {
			return "layout: " + why
		}
		*sc = newSideCheck(seg.Groups)
	}
	for i, sk := range seg.Side {
		if why := (*sc).add(sk.Group, uint64(sk.Key), sk.Key, sk.Blocks); why != "" {
			return fmt.Sprintf("side key %d: %s", i, why)
		}
	}
	return ""
}

// whyCounts says the key's counts are not a valid state.
func (sk *SnapshotKey) whyCounts() string {
	return fmt.Sprintf("inconsistent counts (%d blocks, %v in media, %v stores)", sk.Blocks, sk.BlocksIn, sk.Refs)
}

// readSnapshot reads and checks the segments next returns.
func readSnapshot(next func() (*SnapshotSegment, error)) (*restoreState, error) {
	st := &restoreState{}
	o := segOrder{bad: ErrBadSnapshot, what: "snapshot", maxKeys: SnapshotSegmentKeys}
	var ko keyOrder
	var digest uint64
	var sc *sideCheck
	err := read(&o, next, (*SnapshotSegment).head, func(seg *SnapshotSegment) error {
		if seg.Part == 0 {
			ko = newKeyOrder(seg.Total)
			st.keys = make([]SnapshotKey, 0, cap(ko.parent))
			st.layout = slices.Clone(seg.Groups)
		}
		if why := layoutAndSide(seg, &sc); why != "" {
			return fmt.Errorf("%w: segment %d: %s", ErrBadSnapshot, seg.Part, why)
		}
		st.side = append(st.side, seg.Side...)
		for j := range seg.Keys {
			sk := &seg.Keys[j]
			kc := sk.counts()
			why := ""
			if !kc.valid() {
				why = sk.whyCounts()
			} else {
				why = ko.add(sk.Key, sk.Parent, sk.HasParent, sk.Blocks == 0)
			}
			if why != "" {
				return fmt.Errorf("%w: segment %d key %d (%#016x): %s", ErrBadSnapshot, seg.Part, j, uint64(sk.Key), why)
			}
			st.keys = append(st.keys, *sk)
			if sk.Blocks > 0 {
				st.held++
				digest += digestTerm(sk.Key, kc.media())
			}
		}
		return nil
	})
	if err == nil {
		err = ko.end(&o, digest+sc.digest)
	}
	if err != nil {
		return nil, err
	}
	st.seq, st.parent = o.first.seq, ko.parent
	return st, nil
}

// buildLocked adds the snapshot's layout, keys and side keys to the
// worker, which holds none.
func (st *restoreState) buildLocked(w *Worker) {
	w.adoptLayoutLocked(st.layout)
	w.restoreSideKeysLocked(st.side)
	c := &w.cur
	id := uint32(w.id)
	w.engine.Reserve(st.held)
	kp := newKeyPlacer(st.parent)
	for i := range st.keys {
		sk := &st.keys[i]
		kc := sk.counts()
		media := kc.media()
		var set *holders.Set
		if media != 0 {
			set = w.ix.single(id, media)
		}
		l, fresh := kp.place(c, i, sk.Key, set)
		if media == 0 {
			continue // a placeholder: the next key keeps its node alive
		}
		if !fresh {
			c.change(l, holders.Op{Worker: id, Set: media})
		}
		w.restoreKeyLocked(sk.Key, l, &kc)
	}
}

// restoreKeyLocked inserts restored key k at l with counts kc into the
// keyed worker's engine map and resident counts.
func (w *Worker) restoreKeyLocked(k Key, l loc, kc *keyCounts) {
	h := uint64(k)
	w.engine.Insert(h, uint64(w.setCountsLocked(h, newEntry(l, 0), kc)))
	w.res += int64(kc.blocks)
	for m, n := range kc.in {
		w.resBy[m] += int64(n)
	}
}
