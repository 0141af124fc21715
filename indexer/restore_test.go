package indexer

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// Tests of the one-pass restore, into a worker that holds nothing (see
// Restore); TestRestoreRejectsBadSnapshots covers the two-pass one.

// TestRestoreIntoEmptyRejectsBadSnapshots feeds an empty keyed worker the
// bad snapshots of TestRestoreRejectsBadSnapshots: each is refused with
// ErrBadSnapshot (or the reader's error) at whatever segment it is found,
// and leaves the worker, and the index, empty, with the index's
// invariants intact.
func TestRestoreIntoEmptyRejectsBadSnapshots(t *testing.T) {
	_, ws := newTestIndex(t, "a", "b")
	apply(t, ws[0], chain(1, 0, 0, 6), removed(gpu, 1, 2))
	good := snapshotOf(t, ws[0])[0]
	split := func(at int) []*SnapshotSegment {
		a := &SnapshotSegment{Seq: good.Seq, Total: good.Total, Keys: slices.Clone(good.Keys[:at])}
		b := &SnapshotSegment{Seq: good.Seq, Total: good.Total, Part: 1, Last: true, Digest: good.Digest, Keys: slices.Clone(good.Keys[at:])}
		return []*SnapshotSegment{a, b}
	}
	with := func(f func(s *SnapshotSegment)) []*SnapshotSegment {
		s := *good
		s.Keys = slices.Clone(good.Keys)
		f(&s)
		if s.Total == good.Total {
			s.Total = uint64(len(s.Keys))
		}
		return []*SnapshotSegment{&s}
	}
	held := SnapshotKey{Key: 12345, Blocks: 1, BlocksIn: [events.NumMedia]uint32{gpu: 1}, Refs: [events.NumMedia]uint32{gpu: 1}}
	readErr := errors.New("connection lost")
	failing := func(segs []*SnapshotSegment) func() (*SnapshotSegment, error) {
		next := segmentsOf(segs)
		return func() (*SnapshotSegment, error) {
			s, err := next()
			if err != nil {
				return nil, readErr // after the segments, the connection goes
			}
			return s, nil
		}
	}
	cases := []struct {
		name string
		next func() (*SnapshotSegment, error)
	}{
		{"no segments", segmentsOf(nil)},
		{"no last segment", segmentsOf(with(func(s *SnapshotSegment) { s.Last = false }))},
		{"segment 1 first", segmentsOf(with(func(s *SnapshotSegment) { s.Part = 1 }))},
		{"seqs differ", func() func() (*SnapshotSegment, error) {
			segs := split(3)
			segs[1].Seq++
			return segmentsOf(segs)
		}()},
		{"totals differ", func() func() (*SnapshotSegment, error) {
			segs := split(3)
			segs[1].Total++
			return segmentsOf(segs)
		}()},
		{"fewer keys than the total", segmentsOf(with(func(s *SnapshotSegment) { s.Total = 7 }))},
		{"more keys than the total", segmentsOf(with(func(s *SnapshotSegment) { s.Total = 5 }))},
		{"a segment after the last", segmentsOf(append(with(func(*SnapshotSegment) {}), &SnapshotSegment{Part: 1}))},
		{"a nil segment", segmentsOf([]*SnapshotSegment{nil})},
		{"too many keys", segmentsOf(with(func(s *SnapshotSegment) {
			for i := range SnapshotSegmentKeys {
				k := held
				k.Key = Key(i + 1)
				s.Keys = append(s.Keys, k)
			}
		}))},
		{"a key twice", segmentsOf(with(func(s *SnapshotSegment) { s.Keys = append(s.Keys, s.Keys[5]) }))},
		{"a placeholder twice", segmentsOf(with(func(s *SnapshotSegment) {
			dup := s.Keys[0]
			dup.Parent, dup.HasParent = s.Keys[5].Key, true
			s.Keys = append(s.Keys, dup, SnapshotKey{Key: 4242, Parent: dup.Key, HasParent: true, Blocks: 1, BlocksIn: held.BlocksIn, Refs: held.Refs})
		}))},
		{"a key twice across segments", func() func() (*SnapshotSegment, error) {
			segs := split(4)
			segs[1].Keys = append(segs[1].Keys, segs[0].Keys[3])
			segs[0].Total++
			segs[1].Total++
			return segmentsOf(segs)
		}()},
		{"a parent after its key", segmentsOf(with(func(s *SnapshotSegment) { s.Keys[3], s.Keys[4] = s.Keys[4], s.Keys[3] }))},
		{"a key under an unknown parent", segmentsOf(with(func(s *SnapshotSegment) { s.Keys[3].Parent = 999 }))},
		{"a placeholder not followed by its child", segmentsOf(with(func(s *SnapshotSegment) {
			s.Keys = slices.Insert(s.Keys, 1, held)
		}))},
		{"a placeholder last", segmentsOf(with(func(s *SnapshotSegment) {
			s.Keys = append(s.Keys, SnapshotKey{Key: 777, Parent: s.Keys[5].Key, HasParent: true})
		}))},
		{"a placeholder last, after a split", func() func() (*SnapshotSegment, error) {
			segs := split(1) // the first segment ends with a placeholder, carried
			segs[1].Keys = segs[1].Keys[:0]
			segs[0].Total, segs[1].Total = 1, 1
			return segmentsOf(segs)
		}()},
		{"inconsistent counts", segmentsOf(with(func(s *SnapshotSegment) { s.Keys[4].Refs[gpu] = 0 }))},
		{"more blocks than media hold", segmentsOf(with(func(s *SnapshotSegment) { s.Keys[4].Blocks = 2 }))},
		{"another digest", segmentsOf(with(func(s *SnapshotSegment) { s.Digest++ }))},
		{"another digest, after a split", func() func() (*SnapshotSegment, error) {
			segs := split(3)
			segs[1].Digest++
			return segmentsOf(segs)
		}()},
		{"a key in another medium", segmentsOf(with(func(s *SnapshotSegment) {
			s.Keys[4].BlocksIn, s.Keys[4].Refs = s.Keys[4].Refs, [events.NumMedia]uint32{cpu: 1}
			s.Keys[4].BlocksIn = s.Keys[4].Refs
		}))},
		{"a reader's error", func() (*SnapshotSegment, error) { return nil, readErr }},
		{"a reader's error after the keys", failing(split(3))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rix, rep := newKeyedIndex(t, Config{Shards: 4})
			err := rep.Restore(tc.next)
			want := ErrBadSnapshot
			if errors.Is(err, readErr) {
				want = readErr
			}
			if !errors.Is(err, want) || (want == readErr) != (tc.name == "a reader's error" || tc.name == "a reader's error after the keys") {
				t.Fatalf("error %v", err)
			}
			if d, n := rep.Digest(), rep.Stats().ResidentBlocks; d != 0 || n != 0 {
				t.Fatalf("the worker is not empty: digest %#x, %d blocks", d, n)
			}
			if n := rix.resident.Load(); n != 0 {
				t.Fatalf("the index counts %d resident blocks", n)
			}
			if m := matchOf(rix, chainTokens(0, 6), nil, rep); m.Blocks != 0 {
				t.Fatalf("the refused snapshot still matches: %+v", m)
			}
			checkInvariants(t, rix)
		})
	}
}

// TestRestoreIntoEmptyAtEverySplit restores a snapshot with placeholders
// (parents evicted before their children, a branch under a placeholder)
// split in two and in three at every position, so that segments end on
// placeholders (carried to the next segment, with the key under them),
// on chains and on branches: each restore is the source's state.
func TestRestoreIntoEmptyAtEverySplit(t *testing.T) {
	six, ws := newTestIndex(t, "a")
	branch := stored(3, true, []uint64{50, 51}, seqTokens(900, 8))
	apply(t, ws[0], chain(1, 0, 0, 6), branch, removed(gpu, 1, 2, 3))
	seg := snapshotOf(t, ws[0])[0]
	keys := seg.Keys
	holes := 0
	for _, k := range keys {
		if k.Blocks == 0 {
			holes++
		}
	}
	if holes < 3 {
		t.Fatalf("the snapshot has %d placeholders, want 3 or more", holes)
	}
	parts := func(cuts ...int) []*SnapshotSegment {
		var segs []*SnapshotSegment
		from := 0
		for i, c := range append(cuts, len(keys)) {
			segs = append(segs, &SnapshotSegment{Seq: seg.Seq, Total: seg.Total, Part: uint32(i), Keys: slices.Clone(keys[from:c])})
			from = c
		}
		segs[len(segs)-1].Last, segs[len(segs)-1].Digest = true, seg.Digest
		return segs
	}
	prompts := [][]Key{PromptKeys(testModel, 4, chainTokens(0, 6), nil, nil), PromptKeys(testModel, 4, append(chainTokens(0, 3), seqTokens(900, 8)...), nil, nil)}
	for a := 0; a <= len(keys); a++ {
		for b := a; b <= len(keys); b++ {
			t.Run(fmt.Sprintf("%d,%d", a, b), func(t *testing.T) {
				rix, rep := newKeyedIndex(t, Config{Shards: 4})
				if err := rep.Restore(segmentsOf(parts(a, b))); err != nil {
					t.Fatal(err)
				}
				checkReplica(t, six, rix, ws[0], rep, prompts, "restored")
				checkInvariants(t, rix)
			})
		}
	}
}

// TestRestoreIntoEmptyWorkerChanged: between two segments of a one-pass
// restore the mutex is free; a call that changes the worker meanwhile
// ends the restore (not as a bad snapshot), and the worker is left empty;
// a removal of the worker is ErrRemovedWorker.
func TestRestoreIntoEmptyWorkerChanged(t *testing.T) {
	_, ws := newTestIndex(t, "a")
	apply(t, ws[0], chain(1, 0, 0, 6))
	seg := snapshotOf(t, ws[0])[0]
	two := []*SnapshotSegment{
		{Seq: seg.Seq, Total: seg.Total, Keys: slices.Clone(seg.Keys[:3])},
		{Seq: seg.Seq, Total: seg.Total, Part: 1, Last: true, Digest: seg.Digest, Keys: slices.Clone(seg.Keys[3:])},
	}
	between := func(f func()) func() (*SnapshotSegment, error) {
		next := segmentsOf(two)
		n := 0
		return func() (*SnapshotSegment, error) {
			if n++; n == 2 {
				f()
			}
			return next()
		}
	}
	rix, rep := newKeyedIndex(t, Config{Shards: 4})
	err := rep.Restore(between(func() {
		d := Delta{Seq: 9, Entries: []DeltaEntry{{Op: OpStore, Key: 4242, BlockEdge: true, MediumEdge: true}}}
		if err := rep.ApplyDelta(&d); err != nil {
			t.Errorf("the delta between segments: %v", err)
		}
	}))
	if err == nil || errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("a worker changed mid-restore: error %v, want one that is not ErrBadSnapshot", err)
	}
	if d, n := rep.Digest(), rep.Stats().ResidentBlocks; d != 0 || n != 0 {
		t.Fatalf("the worker is not empty: digest %#x, %d blocks", d, n)
	}
	checkInvariants(t, rix)
	err = rep.Restore(between(func() {
		if err := rix.RemoveWorker(rep.Info().Ref); err != nil {
			t.Errorf("remove: %v", err)
		}
	}))
	if !errors.Is(err, ErrRemovedWorker) {
		t.Fatalf("a worker removed mid-restore: error %v, want ErrRemovedWorker", err)
	}
	if n := rix.resident.Load(); n != 0 {
		t.Fatalf("the index counts %d resident blocks", n)
	}
	checkInvariants(t, rix)
}
