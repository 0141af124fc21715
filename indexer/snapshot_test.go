package indexer

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// TestRestorePlacesKeysUnderTheirParents restores snapshots of workers
// whose engines evicted parents before their children, and checks that
// every key is restored under its true parent, through placeholders held
// by nobody: the snapshot's keys exactly (for the first case), and that
// when another worker stores the full chains (before or after the
// restore) every prompt gets the same answers from the replica's index as
// from the source's, both workers found, and no key has two nodes (no
// collision met, every node reachable from heads).
func TestRestorePlacesKeysUnderTheirParents(t *testing.T) {
	k := PromptKeys(testModel, 4, chainTokens(0, 6), nil, nil)
	branchTokens := append(chainTokens(0, 3), seqTokens(900, 8)...)
	kb := PromptKeys(testModel, 4, branchTokens, nil, nil)
	branch := stored(3, true, []uint64{50, 51}, seqTokens(900, 8)) // two blocks under block 2
	cases := []struct {
		name   string
		evs    []events.Event
		keys   []SnapshotKey // the snapshot's, when given
		prompt [][]Key
	}{
		{
			name: "chain's first two blocks evicted",
			evs:  []events.Event{chain(1, 0, 0, 6), removed(gpu, 1, 2)},
			keys: []SnapshotKey{
				{Key: k[0]},
				{Key: k[1], Parent: k[0], HasParent: true},
				{Key: k[2], Parent: k[1], HasParent: true, Blocks: 1, BlocksIn: [events.NumMedia]uint32{gpu: 1}, Refs: [events.NumMedia]uint32{gpu: 1}},
				{Key: k[3], Parent: k[2], HasParent: true, Blocks: 1, BlocksIn: [events.NumMedia]uint32{gpu: 1}, Refs: [events.NumMedia]uint32{gpu: 1}},
				{Key: k[4], Parent: k[3], HasParent: true, Blocks: 1, BlocksIn: [events.NumMedia]uint32{gpu: 1}, Refs: [events.NumMedia]uint32{gpu: 1}},
				{Key: k[5], Parent: k[4], HasParent: true, Blocks: 1, BlocksIn: [events.NumMedia]uint32{gpu: 1}, Refs: [events.NumMedia]uint32{gpu: 1}},
			},
		},
		{name: "a middle block evicted", evs: []events.Event{chain(1, 0, 0, 6), removed(gpu, 3)}},
		{name: "a branch point's ancestors evicted", evs: []events.Event{chain(1, 0, 0, 6), branch, removed(gpu, 2, 3)}},
		{name: "only leaves left", evs: []events.Event{chain(1, 0, 0, 6), branch, removed(gpu, 1, 2, 3, 4, 5)}},
		{name: "an offloaded block whose GPU copy went", evs: []events.Event{chain(1, 0, 0, 6), offload(cpu, 2), removed(gpu, 2)}},
	}
	for _, tc := range cases {
		for _, otherFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/other worker first %v", tc.name, otherFirst), func(t *testing.T) {
				six, sws := newTestIndex(t, "a", "o")
				rix, rep := newKeyedIndex(t, Config{Shards: 4})
				other, err := rix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "o"}, Model: testModel})
				if err != nil {
					t.Fatal(err)
				}
				full := []events.Event{chain(1, 0, 0, 6), branch}
				if otherFirst {
					apply(t, sws[1], full...)
					apply(t, other, full...)
				}
				apply(t, sws[0], tc.evs...)
				segs := snapshotOf(t, sws[0])
				if tc.keys != nil && (len(segs) != 1 || !slices.Equal(segs[0].Keys, tc.keys)) {
					t.Fatalf("snapshot %+v,\nwant keys %+v", segs, tc.keys)
				}
				if err := rep.Restore(segmentsOf(segs)); err != nil {
					t.Fatal(err)
				}
				if !otherFirst {
					apply(t, sws[1], full...)
					apply(t, other, full...)
				}
				prompts := [][]Key{k, k[:1], k[:3], kb}
				checkReplica(t, six, rix, sws[0], rep, prompts, "restored")
				if m := matchOf(rix, chainTokens(0, 6), nil, other); m.Blocks != 6 {
					t.Fatalf("the other worker's match %+v, want 6 blocks", m)
				}
				if m := matchOf(rix, branchTokens, nil, other); m.Blocks != 5 {
					t.Fatalf("the other worker's branch match %+v, want 5 blocks", m)
				}
				if n := rix.collisions.Load(); n != 0 {
					t.Fatalf("%d key collisions: a key has two nodes", n)
				}
				checkInvariants(t, rix)
			})
		}
	}
}

// chainsWorker returns an index with one worker holding n blocks in
// chains of per blocks, each from the root.
func chainsWorker(t testing.TB, n, per int) (*Index, *Worker) {
	t.Helper()
	f := newFleet(t, 1, Config{})
	w := f.ws[0]
	var evs []events.Event
	for c := 0; c < n/per; c++ {
		tokens := make([]uint32, per*benchBS)
		for i := range tokens {
			tokens[i] = uint32(c*len(tokens) + i)
		}
		e, _ := storeEvents(0, false, f.root, tokens, per)
		evs = append(evs, e...)
	}
	if err := w.ApplyBatch(&events.Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
	return f.ix, w
}

// TestSnapshotSegmentsAreBounded checks a 10,000-block snapshot's
// segments: at most SnapshotSegmentKeys keys each, numbered, one seq, the
// last one last with the digest, 10 bytes a key encoded (18 for the
// first of a chain), and that a restore from them reproduces the worker.
func TestSnapshotSegmentsAreBounded(t *testing.T) {
	six, w := chainsWorker(t, 10000, 50)
	var d Delta
	d.Seq = 41
	if err := w.ApplyBatchDelta(&events.Batch{}, &d); err != nil {
		t.Fatal(err)
	}
	segs := snapshotOf(t, w)
	if len(segs) != 3 {
		t.Fatalf("%d segments, want 3", len(segs))
	}
	bytes := 0
	for i, s := range segs {
		if s.Part != uint32(i) || s.Seq != 41 || s.Last != (i == 2) || len(s.Keys) > SnapshotSegmentKeys {
			t.Fatalf("segment %d: part %d seq %d last %v, %d keys", i, s.Part, s.Seq, s.Last, len(s.Keys))
		}
		b, _ := s.AppendBinary(nil)
		bytes += len(b)
	}
	if segs[2].Digest != w.Digest() {
		t.Fatalf("last segment's digest %#x, the worker's %#x", segs[2].Digest, w.Digest())
	}
	// 200 chains: their first keys at top level (10 bytes, as the others),
	// their first keys in a segment under an explicit parent (18).
	if want := 10000*10 + 2*8 + 3*16; bytes > want {
		t.Fatalf("%d bytes encoded, want at most %d", bytes, want)
	}
	rix, rep := newKeyedIndexOf(t, benchModel, benchBS)
	if err := rep.Restore(segmentsOf(segs)); err != nil {
		t.Fatal(err)
	}
	if rep.DeltaSeq() != 41 {
		t.Fatalf("restored at seq %d, want 41", rep.DeltaSeq())
	}
	checkReplica(t, six, rix, w, rep, nil, "restored")
}

// newKeyedIndexOf returns an index of one model with one keyed worker.
func newKeyedIndexOf(t *testing.T, model string, bs int) (*Index, *Worker) {
	t.Helper()
	ix := New(Config{})
	if _, err := ix.AddModel(model, bs); err != nil {
		t.Fatal(err)
	}
	w, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "replica"}, Model: model, Keyed: true})
	if err != nil {
		t.Fatal(err)
	}
	return ix, w
}

// TestRestoreRejectsBadSnapshots checks that incomplete, disordered or
// inconsistent snapshots are refused (ErrBadSnapshot, or the reader's
// error) and leave the worker as it was; that a restore replaces what the
// worker held; and that an empty worker's snapshot is one empty last
// segment.
func TestRestoreRejectsBadSnapshots(t *testing.T) {
	_, ws := newTestIndex(t, "a", "b")
	apply(t, ws[0], chain(1, 0, 0, 6), removed(gpu, 1, 2))
	apply(t, ws[1], chain(1, 7, 0, 3))
	good := snapshotOf(t, ws[0])[0]
	other := snapshotOf(t, ws[1])
	rix, rep := newKeyedIndex(t, Config{Shards: 4})
	if err := rep.Restore(segmentsOf(other)); err != nil {
		t.Fatal(err)
	}
	before := rep.Digest()
	if before != ws[1].Digest() {
		t.Fatalf("restored digest %#x, source's %#x", before, ws[1].Digest())
	}
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
		{"a parent after its key", segmentsOf(with(func(s *SnapshotSegment) { s.Keys[3], s.Keys[4] = s.Keys[4], s.Keys[3] }))},
		{"a key under an unknown parent", segmentsOf(with(func(s *SnapshotSegment) { s.Keys[3].Parent = 999 }))},
		{"a placeholder not followed by its child", segmentsOf(with(func(s *SnapshotSegment) {
			s.Keys = slices.Insert(s.Keys, 1, held)
		}))},
		{"a placeholder last", segmentsOf(with(func(s *SnapshotSegment) {
			s.Keys = append(s.Keys, SnapshotKey{Key: 777, Parent: s.Keys[5].Key, HasParent: true})
		}))},
		{"inconsistent counts", segmentsOf(with(func(s *SnapshotSegment) { s.Keys[4].Refs[gpu] = 0 }))},
		{"more blocks than media hold", segmentsOf(with(func(s *SnapshotSegment) { s.Keys[4].Blocks = 2 }))},
		{"another digest", segmentsOf(with(func(s *SnapshotSegment) { s.Digest++ }))},
		{"a key in another medium", segmentsOf(with(func(s *SnapshotSegment) {
			s.Keys[4].BlocksIn, s.Keys[4].Refs = s.Keys[4].Refs, [events.NumMedia]uint32{cpu: 1}
			s.Keys[4].BlocksIn = s.Keys[4].Refs
		}))},
		{"a reader's error", func() (*SnapshotSegment, error) { return nil, readErr }},
	}
	for _, tc := range cases {
		err := rep.Restore(tc.next)
		want := ErrBadSnapshot
		if tc.name == "a reader's error" {
			want = readErr
		}
		if !errors.Is(err, want) {
			t.Fatalf("%s: error %v, want %v", tc.name, err, want)
		}
		if got := rep.Digest(); got != before {
			t.Fatalf("%s: the worker changed (digest %#x, was %#x)", tc.name, got, before)
		}
	}
	// A valid split, and the restore replaces the worker's state.
	if err := rep.Restore(segmentsOf(split(3))); err != nil {
		t.Fatal(err)
	}
	if rep.Digest() != ws[0].Digest() {
		t.Fatalf("digest %#x, source's %#x", rep.Digest(), ws[0].Digest())
	}
	if m := matchOf(rix, chainTokens(7, 3), nil, rep); m.Blocks != 0 {
		t.Fatalf("the replaced state still matches: %+v", m)
	}
	checkInvariants(t, rix)
	// An empty worker.
	_, es := newTestIndex(t, "e")
	segs := snapshotOf(t, es[0])
	if len(segs) != 1 || !segs[0].Last || len(segs[0].Keys) != 0 || segs[0].Digest != 0 {
		t.Fatalf("empty worker's snapshot %+v", segs)
	}
	if err := rep.Restore(segmentsOf(segs)); err != nil || rep.Digest() != 0 || rep.Stats().ResidentBlocks != 0 {
		t.Fatalf("restore of nothing: %v, digest %#x, stats %+v", err, rep.Digest(), rep.Stats())
	}
	// Removed workers.
	if err := rix.RemoveWorker(rep.Info().Ref); err != nil {
		t.Fatal(err)
	}
	if err := rep.Restore(segmentsOf(segs)); !errors.Is(err, ErrRemovedWorker) {
		t.Fatalf("restore into a removed worker: %v", err)
	}
	if err := rep.Snapshot(func(*SnapshotSegment) error { return nil }); !errors.Is(err, ErrRemovedWorker) {
		t.Fatalf("snapshot of a removed worker: %v", err)
	}
	emitErr := errors.New("send failed")
	if err := ws[0].Snapshot(func(*SnapshotSegment) error { return emitErr }); !errors.Is(err, emitErr) {
		t.Fatalf("snapshot whose emit fails: %v", err)
	}
}

// testSegment has every form of key: top level, under the previous key,
// under another key; held once, counted (an alias stored twice), a
// placeholder; and the digest of a last segment.
func testSegment() *SnapshotSegment {
	return &SnapshotSegment{Seq: 1 << 40, Part: 3, Total: 20000, Last: true, Digest: 0xfeedface12345678, Keys: []SnapshotKey{
		{Key: 1},
		{Key: 2, Parent: 1, HasParent: true, Blocks: 1, BlocksIn: [events.NumMedia]uint32{gpu: 1, cpu: 1}, Refs: [events.NumMedia]uint32{gpu: 1, cpu: 1}},
		{Key: 3, Parent: 1, HasParent: true, Blocks: 2, BlocksIn: [events.NumMedia]uint32{gpu: 2, 5: 1}, Refs: [events.NumMedia]uint32{gpu: 300, 5: 1 << 31}},
		{Key: 1 << 63, Blocks: 1, BlocksIn: [events.NumMedia]uint32{5: 1}, Refs: [events.NumMedia]uint32{5: 1}},
	}, TotalSide: 300, Side: []SideKey{{Group: 2, Key: 5, Blocks: 1}, {Group: MaxGroups - 1, Key: 1 << 63, Blocks: 300}}}
}

// TestSnapshotEncoding checks that a segment with every form of key
// survives its encoding, what a key costs, and that every truncation and
// corruption is refused with ErrBadSnapshot.
func TestSnapshotEncoding(t *testing.T) {
	s := testSegment()
	b, err := s.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	got := SnapshotSegment{Keys: make([]SnapshotKey, 0, 1)}
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got, s) {
		t.Fatalf("decoded %+v,\nwant %+v", got, *s)
	}
	// header 1+6+1+3+2+1+8+1, keys 9 (placeholder at top), 10 (under the
	// previous key), 9+8+1+1+(1+2)+(1+5) (counted under key 1), 10; side
	// keys: a count, then group, key and blocks, 1+8+1 and 1+8+2.
	if want := 23 + 9 + 10 + 28 + 10 + 22; len(b) != want {
		t.Fatalf("%d bytes, want %d", len(b), want)
	}
	for n := range len(b) {
		if err := got.UnmarshalBinary(b[:n]); !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("%d of %d bytes: error %v", n, len(b), err)
		}
	}
	corrupt := map[string]func([]byte) []byte{
		"version":           func(b []byte) []byte { b[0] = 3; return b },
		"last flag":         func(b []byte) []byte { b[13] = 2; return b },
		"trailing byte":     func(b []byte) []byte { return append(b, 0) },
		"tag bits":          func(b []byte) []byte { b[23] |= 0x10; return b },
		"tag parent mode 3": func(b []byte) []byte { b[23] |= 3; return b },
		"first key under the previous": func(b []byte) []byte {
			b[23] &^= tagParentMask
			return b
		},
		"media": func(b []byte) []byte { b[23+9+9] = 0x40; return b },
		"no media": func(b []byte) []byte {
			b[23+9+9] = 0
			return b
		},
		"side group": func(b []byte) []byte { b[len(b)-11] = MaxGroups; return b },
	}
	for name, f := range corrupt {
		if err := got.UnmarshalBinary(f(slices.Clone(b))); !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("%s: error %v", name, err)
		}
	}
	big := &SnapshotSegment{Keys: make([]SnapshotKey, SnapshotSegmentKeys+1)}
	if _, err := big.AppendBinary(nil); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("encoding %d keys: %v", len(big.Keys), err)
	}
	// Part 0 carries the layout.
	first := &SnapshotSegment{Total: 1, Last: true, Keys: []SnapshotKey{{Key: 9, Blocks: 1, BlocksIn: [events.NumMedia]uint32{gpu: 1}, Refs: [events.NumMedia]uint32{gpu: 1}}},
		Groups: []Group{{Index: 0, Kind: "full_attention", Class: ClassPrefix, BlockSize: 528, Anchor: true}, {Index: 1, Kind: "mamba", Class: ClassMamba, BlockSize: 528}}}
	b0, err := first.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	var got0 SnapshotSegment
	if err := got0.UnmarshalBinary(b0); err != nil || !reflect.DeepEqual(&got0, first) {
		t.Fatalf("part 0: decoded %+v (%v), want %+v", got0, err, *first)
	}
	// Version 1 (no side keys, no layout) still decodes.
	v1 := testSegment()
	v1.TotalSide, v1.Side = 0, nil
	b1, _ := v1.AppendBinary(nil)
	b1 = slices.Delete(b1, 11, 12) // the total side (0)
	b1 = b1[:len(b1)-1]            // the side count (0)
	b1[0] = segVersion1
	if err := got.UnmarshalBinary(b1); err != nil || !reflect.DeepEqual(&got, v1) {
		t.Fatalf("version 1: decoded %+v (%v), want %+v", got, err, *v1)
	}
}

// FuzzSnapshotSegment checks that decoding never panics and that a
// decoded segment survives encoding and decoding again.
func FuzzSnapshotSegment(f *testing.F) {
	b, _ := testSegment().AppendBinary(nil)
	f.Add(b)
	e, _ := (&SnapshotSegment{}).AppendBinary(nil)
	f.Add(e)
	f.Fuzz(func(t *testing.T, data []byte) {
		var s SnapshotSegment
		if err := s.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, ErrBadSnapshot) {
				t.Fatalf("error %v does not wrap ErrBadSnapshot", err)
			}
			return
		}
		again, err := s.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		var s2 SnapshotSegment
		if err := s2.UnmarshalBinary(again); err != nil {
			t.Fatalf("re-encoded segment does not decode: %v", err)
		}
		if !reflect.DeepEqual(s.Keys, s2.Keys) && (len(s.Keys) != 0 || len(s2.Keys) != 0) {
			t.Fatalf("keys %+v became %+v", s.Keys, s2.Keys)
		}
		s.Keys, s2.Keys = nil, nil
		if !reflect.DeepEqual(s, s2) {
			t.Fatalf("segment %+v became %+v", s, s2)
		}
	})
}
