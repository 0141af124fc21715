package indexer

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// normCheckpointSegment makes empty slices nil, so that a segment and its
// decoding compare equal.
func normCheckpointSegment(s *CheckpointSegment) {
	if len(s.Keys) == 0 {
		s.Keys = nil
	}
	if len(s.Blocks) == 0 {
		s.Blocks = nil
	}
	if len(s.State.Groups) == 0 {
		s.State.Groups = nil
	}
}

// takeCheckpoint takes w's checkpoint through the segments' encoding,
// checking that each segment survives it.
func takeCheckpoint(w *Worker) ([]*CheckpointSegment, error) {
	var segs []*CheckpointSegment
	err := w.Checkpoint(func(s *CheckpointSegment) error {
		b, err := s.AppendBinary(nil)
		if err != nil {
			return err
		}
		var got CheckpointSegment
		if err := got.UnmarshalBinary(b); err != nil {
			return err
		}
		want := *s
		normCheckpointSegment(&want)
		normCheckpointSegment(&got)
		if !reflect.DeepEqual(&got, &want) {
			return fmt.Errorf("segment %d does not survive its encoding:\n got %+v\nwant %+v", s.Part, got, want)
		}
		segs = append(segs, &got)
		return nil
	})
	return segs, err
}

// checkpointOf is takeCheckpoint, failing t on an error.
func checkpointOf(t *testing.T, w *Worker) []*CheckpointSegment {
	t.Helper()
	segs, err := takeCheckpoint(w)
	if err != nil {
		t.Fatalf("checkpoint of %s: %v", w.Info().Ref, err)
	}
	return segs
}

// checkpointSegmentsOf returns a next function for RestoreCheckpoint
// that returns segs, then io.EOF.
func checkpointSegmentsOf(segs []*CheckpointSegment) func() (*CheckpointSegment, error) {
	i := 0
	return func() (*CheckpointSegment, error) {
		if i == len(segs) {
			return nil, io.EOF
		}
		i++
		return segs[i-1], nil
	}
}

// blockState is what a worker holds of one engine block: its key, where
// the key attaches, its stores per medium, and (when compared) its age.
type blockState struct {
	key    Key
	parent treeParent
	refs   [events.NumMedia]uint8
	age    uint8
}

// workerState is everything of a worker fed engine events that decides
// what later events do to it.
type workerState struct {
	blocks    map[uint64]blockState
	aliases   map[Key]alias
	learned   [events.NumMedia]int64
	groups    []Group
	lastReset string
	res       int64
	resBy     [events.NumMedia]int64
	capacity  int64
}

// stateOf reads w's state; with ages false the blocks' ages are left out.
func stateOf(w *Worker, ages bool) workerState {
	w.mu.Lock()
	defer w.mu.Unlock()
	keyAt := func(l loc) Key {
		l.n.mu.Lock()
		defer l.n.mu.Unlock()
		return l.n.keys[l.off]
	}
	s := workerState{blocks: map[uint64]blockState{}, aliases: map[Key]alias{}, learned: w.learned,
		groups: w.layoutLocked(), lastReset: w.lastReset, res: w.res, resBy: w.resBy, capacity: w.capacityLocked()}
	for slot := range w.engine.All() {
		l := w.locOf(w.entry(slot))
		bs := blockState{key: keyAt(l), parent: treeParent{top: true}, refs: w.refsOf(slot)}
		if p, ok := parentLoc(l); ok {
			bs.parent = treeParent{parent: keyAt(p)}
		}
		if ages {
			bs.age = w.engine.Age(slot)
		}
		s.blocks[w.engine.Hash(slot)] = bs
	}
	for l, a := range w.aliases {
		s.aliases[keyAt(l)] = *a
	}
	return s
}

// counterStats are the cumulative counters of a Stats.
func counterStats(s Stats) [11]int64 {
	return [11]int64{s.BlocksStored, s.BlocksRemoved, s.Orphans, s.UnknownBlocks, s.BlockSizeMismatches, s.InvalidEvents,
		s.SkippedGroupEvents, s.Clears, s.Resets, s.Evictions, s.DeltaMismatches}
}

// checkSameWorker checks that restored worker rw (in rix) is source worker
// sw (in six): equal state (ages too, when ages), digests, resident
// counts, capacity and last reset, counters that grew alike since the
// restore (sBase and rBase), and equal answers from both indexes for
// every prompt.
func checkSameWorker(t *testing.T, six, rix *Index, sw, rw *Worker, sBase, rBase Stats, prompts [][]Key, ages bool, what string) {
	t.Helper()
	if a, b := stateOf(sw, ages), stateOf(rw, ages); !reflect.DeepEqual(a, b) {
		for h, bs := range a.blocks {
			if b.blocks[h] != bs {
				t.Fatalf("%s: block %#x is %+v, in the source %+v", what, h, b.blocks[h], bs)
			}
		}
		t.Fatalf("%s: state\n%+v\nsource's\n%+v", what, b, a)
	}
	if a, b := sw.Digest(), rw.Digest(); a != b {
		t.Fatalf("%s: digest %#x, source %#x", what, b, a)
	}
	ss, rs := sw.Stats(), rw.Stats()
	if ss.ResidentBlocks != rs.ResidentBlocks || ss.ResidentByMedium != rs.ResidentByMedium || ss.Capacity != rs.Capacity || ss.LastReset != rs.LastReset {
		t.Fatalf("%s: stats %+v, source %+v", what, rs, ss)
	}
	sc, rc, sb, rb := counterStats(ss), counterStats(rs), counterStats(sBase), counterStats(rBase)
	for i := range sc {
		if sc[i]-sb[i] != rc[i]-rb[i] {
			t.Fatalf("%s: counters grew by %v since the restore, the source's by %v", what, sub(rc, rb), sub(sc, sb))
		}
	}
	for pi, keys := range prompts {
		got := sortMatches(rix.Match(keys, nil, nil))
		want := sortMatches(six.Match(keys, nil, nil))
		if len(got) == 0 && len(want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: prompt %d (%d keys): Match = %+v, source index %+v", what, pi, len(keys), got, want)
		}
	}
}

func sub(a, b [11]int64) [11]int64 {
	for i := range a {
		a[i] -= b[i]
	}
	return a
}

// TestCheckpointRestoresExactly restores a worker whose state has every
// part a checkpoint carries: a chain with a block stored twice, an
// offloaded block, a key two engine hashes resolve to (an alias), an
// orphan, a parent evicted before its child (a placeholder), a skipped
// KV-cache group, a learned capacity and a reset's reason. The restored
// worker, in a fresh index, has the same state (ages included), and the
// same later events, which name the engine hashes, do the same to both,
// recording the same deltas.
func TestCheckpointRestoresExactly(t *testing.T) {
	mk := func() (*Index, []*Worker) { return newTestIndex(t, "a", "o") }
	six, sws := mk()
	alias := stored(0, false, []uint64{900}, chainTokens(0, 1)) // block 0's content under another hash
	orphan := stored(777, true, []uint64{600, 601}, seqTokens(5000, 8))
	swa := events.Event{Kind: events.KindBlockStored, BlockSize: 4, BlockHashes: []uint64{700}, TokenIDs: seqTokens(7000, 4),
		SpecKind: "sliding_window", GroupIdx: 1, HasGroupIdx: true}
	sws[0].ResetDelta("engine restarted: seq went back", &Delta{})
	for _, evs := range [][]events.Event{
		{chain(1, 0, 0, 6), chain(1, 0, 2, 3)}, // block 2 stored twice
		{offload(cpu, 4)},
		{alias, orphan, swa},
		{chain(100, 9, 0, 4), removed(gpu, 100, 101)}, // a parent evicted before its child
		{removed(gpu, 5)},                             // the first removal: capacity learned
	} {
		_ = apply(t, sws[0], evs...)
	}
	_ = apply(t, sws[1], chain(1, 0, 0, 3), chain(100, 9, 0, 4))
	st := stateOf(sws[0], true)
	if len(st.aliases) != 1 || st.learned[gpu] == 0 || len(st.groups) != 2 || st.lastReset == "" || st.blocks[3].refs[gpu] != 2 {
		t.Fatalf("setup: state %+v", st)
	}
	rix, rws := mk()
	var segs [][]*CheckpointSegment
	for _, w := range sws {
		segs = append(segs, checkpointOf(t, w))
	}
	for i, w := range rws {
		if err := w.RestoreCheckpoint(checkpointSegmentsOf(segs[i])); err != nil {
			t.Fatal(err)
		}
	}
	prompts := [][]Key{PromptKeys(testModel, 4, chainTokens(0, 6), nil, nil), PromptKeys(testModel, 4, chainTokens(9, 4), nil, nil)}
	var sBase, rBase [2]Stats
	for i := range sws {
		sBase[i], rBase[i] = sws[i].Stats(), rws[i].Stats()
		checkSameWorker(t, six, rix, sws[i], rws[i], sBase[i], rBase[i], prompts, true, fmt.Sprint("restored worker ", i))
	}
	checkInvariants(t, rix)
	later := [][]events.Event{
		{removed(gpu, 900)}, // the alias leaves; the key stays with block 0
		{removed(gpu, 3)},   // one of block 2's two stores
		{chain(1, 0, 6, 8)}, // continues the chain under block 5's engine hash
		{stored(4, true, []uint64{50}, seqTokens(4444, 4))}, // under an offloaded block
		{removed(gpu, 601), removed(cpu, 5)},
		{{Kind: events.KindBlockRemoved, BlockHashes: []uint64{700}, GroupIdx: 1, HasGroupIdx: true}}, // skipped
		{offload(cpu, 102, 103)},
		{{Kind: events.KindAllBlocksCleared}, chain(1, 0, 0, 2)},
	}
	for step, evs := range later {
		var sd, rd Delta
		serr := sws[0].ApplyBatchDelta(&events.Batch{Events: evs}, &sd)
		rerr := rws[0].ApplyBatchDelta(&events.Batch{Events: evs}, &rd)
		if fmt.Sprint(serr) != fmt.Sprint(rerr) {
			t.Fatalf("step %d: error %v, the source's %v", step, rerr, serr)
		}
		if !reflect.DeepEqual(sd, rd) {
			t.Fatalf("step %d: delta %+v, the source's %+v", step, rd, sd)
		}
		// Ages differ once the epochs advance at other stamps.
		checkSameWorker(t, six, rix, sws[0], rws[0], sBase[0], rBase[0], prompts, false, fmt.Sprint("step ", step))
	}
	checkInvariants(t, rix)
}

// TestRestoredCheckpointEvictsInTheSameOrder: a worker of under 128
// blocks advances its recency epoch at every stamp, so each block has an
// age of its own; restored from its checkpoint, a capacity evicts exactly
// the blocks it evicts from the source.
func TestRestoredCheckpointEvictsInTheSameOrder(t *testing.T) {
	six, sws := newTestIndex(t, "a")
	for i := range 40 {
		_ = apply(t, sws[0], stored(0, false, []uint64{uint64(1000 + i)}, seqTokens(100*i, 4)))
	}
	for _, i := range []int{3, 17, 0, 22, 9} { // stored again: the most recent now
		_ = apply(t, sws[0], stored(0, false, []uint64{uint64(1000 + i)}, seqTokens(100*i, 4)))
	}
	rix, rws := newTestIndex(t, "a")
	if err := rws[0].RestoreCheckpoint(checkpointSegmentsOf(checkpointOf(t, sws[0]))); err != nil {
		t.Fatal(err)
	}
	sBase, rBase := sws[0].Stats(), rws[0].Stats()
	for _, w := range []*Worker{sws[0], rws[0]} {
		w.SetCapacity(8)
	}
	if n := sws[0].Stats().Evictions; n != 40-8 {
		t.Fatalf("setup: %d evictions", n)
	}
	checkSameWorker(t, six, rix, sws[0], rws[0], sBase, rBase, nil, true, "after the evictions")
	for _, i := range []int{3, 17, 0, 22, 9} {
		if _, ok := stateOf(rws[0], false).blocks[uint64(1000+i)]; !ok {
			t.Fatalf("block %d, stored most recently, was evicted", 1000+i)
		}
	}
}

// TestCheckpointProperty applies random batches (stores with shared
// prefixes, repeated stores, offloads, removals across media, orphans,
// hash reuse and so aliases, skipped groups, clears, resets) to three
// workers of one index, as one pod's DP ranks share an agent's index;
// at random points it checkpoints every worker through the encoding and
// restores them into a fresh index (now and then into the last one,
// replacing its state), then applies the rest of the batches to both.
// After every step each restored worker has its source's state (ages
// too, right after a restore), digest, resident counts, capacity and
// counter increments, records the same delta and returns the same error
// for the same batch, and both indexes answer every prompt alike; and
// the trees' invariants hold. Capacities are left to be learned (at least
// 4,096 blocks, so no eviction happens): the eviction order after a
// restore is the source's only to within an epoch (see
// TestRestoredCheckpointEvictsInTheSameOrder), which would make the
// states differ.
func TestCheckpointProperty(t *testing.T) {
	seeds, steps := 12, 300
	if testing.Short() {
		seeds = 4
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(seed), 23))
			u := newUniverse(r, 12, 10, 4)
			if seed%2 == 1 {
				u = newUniverse(r, 8, 100, 2) // long runs, compaction
			}
			const nw = 3
			mk := func() (*Index, []*Worker) {
				ix := New(Config{Shards: 4})
				if _, err := ix.AddModel(propModel, u.bs); err != nil {
					t.Fatal(err)
				}
				var ws []*Worker
				for i := range nw {
					w, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "p", DPRank: i}, Model: propModel})
					if err != nil {
						t.Fatal(err)
					}
					ws = append(ws, w)
				}
				return ix, ws
			}
			six, sws := mk()
			var rix *Index
			var rws []*Worker
			var sBase, rBase [nw]Stats
			ref := newRefIndex()
			ref.addModel(propModel, u.bs)
			var steer []*refWorker // choose the events only
			for i := range nw {
				rw := ref.addWorker(propModel)
				rw.id = sws[i].ID()
				steer = append(steer, rw)
			}
			g := &gen{r: r, u: u}
			prompts := u.prompts()
			restores := 0
			for step := range steps {
				i := r.IntN(nw)
				var sd, rd Delta
				if r.IntN(60) == 0 {
					sws[i].ResetDelta(fmt.Sprint("reset at step ", step), &sd)
					if rws != nil {
						rws[i].ResetDelta(fmt.Sprint("reset at step ", step), &rd)
					}
					steer[i].reset()
				} else {
					b := g.batch(steer[i])
					serr := sws[i].ApplyBatchDelta(b, &sd)
					if rws != nil {
						rerr := rws[i].ApplyBatchDelta(b, &rd)
						if fmt.Sprint(serr) != fmt.Sprint(rerr) {
							t.Fatalf("step %d: worker %d: error %v, the source's %v", step, i, rerr, serr)
						}
					}
					steer[i].apply(b)
				}
				if rws != nil && !reflect.DeepEqual(sd, rd) {
					t.Fatalf("step %d: worker %d: delta %+v, the source's %+v", step, i, rd, sd)
				}
				restored := false
				if r.IntN(25) == 0 {
					if rws == nil || r.IntN(4) > 0 {
						rix, rws = mk()
					}
					for j := range nw {
						if err := rws[j].RestoreCheckpoint(checkpointSegmentsOf(checkpointOf(t, sws[j]))); err != nil {
							t.Fatalf("step %d: restore worker %d: %v", step, j, err)
						}
						sBase[j], rBase[j] = sws[j].Stats(), rws[j].Stats()
					}
					restores++
					restored = true
				}
				if rws == nil {
					continue
				}
				ps := append(prompts, u.randomPrompts(r, 8)...)
				for j := range nw {
					checkSameWorker(t, six, rix, sws[j], rws[j], sBase[j], rBase[j], ps, restored, fmt.Sprintf("step %d worker %d", step, j))
				}
				if step%10 == 9 {
					checkInvariants(t, six)
					checkInvariants(t, rix)
				}
			}
			if restores == 0 {
				t.Fatal("no restore ran")
			}
			if six.collisions.Load() != 0 || (rix != nil && rix.collisions.Load() != 0) {
				t.Fatal("key collisions")
			}
		})
	}
}

// TestCheckpointSegmentsAreBounded checks a 10,000-block checkpoint's
// segments: at most CheckpointSegmentKeys keys each, numbered, the
// totals in each, the state in the first only, the digest in the last,
// and a key held as one block in a chain encoded in 18 or 19 bytes.
func TestCheckpointSegmentsAreBounded(t *testing.T) {
	_, w := chainsWorker(t, 10000, 50)
	segs := checkpointOf(t, w)
	if len(segs) != 3 {
		t.Fatalf("%d segments, want 3", len(segs))
	}
	size := 0
	for i, s := range segs {
		b, _ := s.AppendBinary(nil)
		size += len(b)
		if s.Part != uint32(i) || s.Total != 10000 || s.TotalBlocks != 10000 || s.Last != (i == 2) || len(s.Keys) > CheckpointSegmentKeys ||
			(i > 0 && !s.State.zero()) {
			t.Fatalf("segment %d: part %d total %d/%d last %v keys %d state %+v", i, s.Part, s.Total, s.TotalBlocks, s.Last, len(s.Keys), s.State)
		}
	}
	if segs[2].Digest != w.Digest() {
		t.Fatalf("last segment's digest %#x, worker's %#x", segs[2].Digest, w.Digest())
	}
	// 200 chains of 50: each chain's first key 19 bytes (top level), the
	// others 18 or 19 (an age byte where the age changes).
	if per := float64(size) / 10000; per < 18 || per > 19.1 {
		t.Fatalf("%.2f bytes a block", per)
	}
}

// testCheckpointSegment has every form of key and block: a placeholder
// at top level, a key under the previous one held once, a key under
// another held by two blocks (one stored three times in a medium, one in
// two media), a block whose age is the previous block's, a block in
// every medium; the state of part 0 and the digest of a last segment.
func testCheckpointSegment() *CheckpointSegment {
	return &CheckpointSegment{Part: 0, Total: 20000, TotalBlocks: 30000, Last: true, Digest: 0xfeedface12345678,
		State: CheckpointState{Learned: [events.NumMedia]int64{gpu: 5000, cpu: 1 << 40}, LastReset: "engine restarted",
			Groups: []Group{{Index: 0, Class: ClassPrefix, BlockSize: 16, Anchor: true}, {Index: 1, Kind: "sliding_window", Class: ClassWindow, BlockSize: 16, Window: 128}}},
		Keys: []CheckpointKey{
			{Key: 1},
			{Key: 2, Parent: 1, HasParent: true, Blocks: 1},
			{Key: 3, Parent: 1, HasParent: true, Blocks: 2},
			{Key: 1 << 63, Blocks: 1},
		},
		Blocks: []CheckpointBlock{
			{Hash: 0x1111, Refs: [events.NumMedia]uint8{gpu: 1}, Age: 7},
			{Hash: 0x2222, Refs: [events.NumMedia]uint8{gpu: 3}, Age: 7},
			{Hash: 0x3333, Refs: [events.NumMedia]uint8{gpu: 1, cpu: 1}, Age: 255},
			{Hash: 1<<64 - 1, Refs: [events.NumMedia]uint8{1, 1, 1, 1, 1, 1}, Age: 0},
		},
		TotalSide: 2,
		Side:      []CheckpointSideBlock{{Group: 1, Hash: 0xabc, Key: 0x77, Refs: 1}, {Group: 1, Hash: 0xdef, Key: 0x77, Refs: 300}},
	}
}

// TestCheckpointEncoding checks that a segment with every form of key
// and block survives its encoding (so does a later part, with no state),
// what each costs, and that every truncation and corruption is refused
// with ErrBadCheckpoint, and encoding what Checkpoint cannot produce too.
func TestCheckpointEncoding(t *testing.T) {
	s := testCheckpointSegment()
	b, err := s.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	got := CheckpointSegment{Keys: make([]CheckpointKey, 0, 1)}
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got, s) {
		t.Fatalf("decoded %+v,\nwant %+v", got, *s)
	}
	// The header is 1+1+3+3+1+1+8 bytes; the state 12 of learned
	// capacities (1+2+6+1+1+1), 26 of groups (a count; index, block
	// size, window, kind length, kind and anchor: 1+1+1+1+0+1 and
	// 1+1+2+1+14+1) and 17
	// of reason. Then a count of keys, and the keys: a placeholder at top
	// level, 9 (tag and key); under the previous key, one block, 9 and
	// its flags, hash and age, 10; under key 1, 9 and the parent 8, a
	// count 1, and two blocks: one stored three times with the age of the
	// block before, flags, hash and a store count, 10, one in two media,
	// 10; at top level, one block, 19. Then the side blocks: a count,
	// and group, hash, key and stores, 1+8+8+1 and 1+8+8+2.
	const header, state = 18, 12 + 26 + 17
	keys := 1 + 9 + (9 + 10) + (9 + 8 + 1 + 10 + 10) + (9 + 10)
	if want := header + state + keys + 1 + 18 + 19; len(b) != want {
		t.Fatalf("%d bytes, want %d", len(b), want)
	}
	for n := range len(b) {
		if err := got.UnmarshalBinary(b[:n]); !errors.Is(err, ErrBadCheckpoint) {
			t.Fatalf("%d of %d bytes: error %v", n, len(b), err)
		}
	}
	at := header + state + 1 // the first key's tag
	second := at + 9         // the second key's tag
	corrupt := map[string]func([]byte) []byte{
		"version":                      func(b []byte) []byte { b[0] = 3; return b },
		"last flag":                    func(b []byte) []byte { b[9] = 2; return b },
		"side group":                   func(b []byte) []byte { b[len(b)-19] = MaxGroups; return b },
		"trailing byte":                func(b []byte) []byte { return append(b, 0) },
		"tag bits":                     func(b []byte) []byte { b[at] |= 0x10; return b },
		"tag parent mode 3":            func(b []byte) []byte { b[at] |= 3; return b },
		"tag form 3":                   func(b []byte) []byte { b[at] |= 3 << 2; return b },
		"first key under the previous": func(b []byte) []byte { b[at] &^= tagParentMask; return b },
		"a block in no medium":         func(b []byte) []byte { b[second+9] &^= ckptMediaMask; return b },
		"first block aged as the previous": func(b []byte) []byte {
			b[second+9] |= ckptBlockSameAge
			return b
		},
		"a reason too long": func(b []byte) []byte {
			b[header+12+26] = 0xff
			b[header+12+26+1] = 0x7f
			return b
		},
	}
	for name, f := range corrupt {
		if err := got.UnmarshalBinary(f(slices.Clone(b))); !errors.Is(err, ErrBadCheckpoint) {
			t.Fatalf("%s: error %v", name, err)
		}
	}
	// A count of blocks past what the bytes left could hold, and of none.
	cs := &CheckpointSegment{Part: 1, Keys: []CheckpointKey{{Key: 5, Blocks: 2}},
		Blocks: []CheckpointBlock{{Hash: 1, Refs: [events.NumMedia]uint8{gpu: 1}}, {Hash: 2, Refs: [events.NumMedia]uint8{gpu: 1}}}}
	cb, err := cs.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.UnmarshalBinary(cb); err != nil || !reflect.DeepEqual(&got, cs) {
		t.Fatalf("a later part: %v, %+v", err, got)
	}
	count := 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 8 // the count of the first key's blocks
	for _, n := range []byte{0, 3, 0x7f} {
		c := slices.Clone(cb)
		c[count] = n
		if err := got.UnmarshalBinary(c); !errors.Is(err, ErrBadCheckpoint) {
			t.Fatalf("a count of %d blocks: error %v", n, err)
		}
	}
	for name, bad := range map[string]*CheckpointSegment{
		"too many keys":        {Keys: make([]CheckpointKey, CheckpointSegmentKeys+1)},
		"blocks do not add up": {Keys: []CheckpointKey{{Key: 1, Blocks: 2}}, Blocks: []CheckpointBlock{{Hash: 1, Refs: [events.NumMedia]uint8{gpu: 1}}}},
		"a block in no medium": {Keys: []CheckpointKey{{Key: 1, Blocks: 1}}, Blocks: []CheckpointBlock{{Hash: 1}}},
		"a state in part 1":    {Part: 1, State: CheckpointState{LastReset: "x"}},
		"a reason too long":    {State: CheckpointState{LastReset: string(make([]byte, maxResetReason+1))}},
	} {
		if _, err := bad.AppendBinary(nil); !errors.Is(err, ErrBadCheckpoint) {
			t.Fatalf("encoding %s: %v", name, err)
		}
	}
}

// TestRestoreCheckpointRejectsBad checks that incomplete, disordered or
// inconsistent checkpoints are refused (ErrBadCheckpoint, or the reader's
// error) and leave the worker exactly as it was; that keyed and removed
// workers refuse checkpoints; and that an empty worker's checkpoint is
// one empty last segment that empties a worker.
func TestRestoreCheckpointRejectsBad(t *testing.T) {
	_, ws := newTestIndex(t, "a", "b")
	// Block 0 at hashes 1 and 900 (an alias), block 1 a placeholder.
	apply(t, ws[0], chain(1, 0, 0, 6), removed(gpu, 2), stored(0, false, []uint64{900}, chainTokens(0, 1)))
	apply(t, ws[1], chain(1, 7, 0, 3))
	good := checkpointOf(t, ws[0])[0]
	rix, rws := newTestIndex(t, "a")
	rep := rws[0]
	if err := rep.RestoreCheckpoint(checkpointSegmentsOf(checkpointOf(t, ws[1]))); err != nil {
		t.Fatal(err)
	}
	before := stateOf(rep, true)
	clone := func(s *CheckpointSegment) *CheckpointSegment {
		c := *s
		c.Keys, c.Blocks = slices.Clone(s.Keys), slices.Clone(s.Blocks)
		c.State.Groups = slices.Clone(s.State.Groups)
		return &c
	}
	// split cuts good after key at, whose blocks end at block nb.
	split := func(at int) []*CheckpointSegment {
		nb := 0
		for _, k := range good.Keys[:at] {
			nb += int(k.Blocks)
		}
		a, b := clone(good), clone(good)
		a.Keys, a.Blocks, a.Last, a.Digest = a.Keys[:at], a.Blocks[:nb], false, 0
		b.Keys, b.Blocks, b.Part, b.State = b.Keys[at:], b.Blocks[nb:], 1, CheckpointState{}
		return []*CheckpointSegment{a, b}
	}
	with := func(f func(s *CheckpointSegment)) []*CheckpointSegment {
		s := clone(good)
		f(s)
		return []*CheckpointSegment{s}
	}
	if good.Keys[0].Blocks != 2 || good.Keys[1].Blocks != 0 || len(good.Keys) != 6 {
		t.Fatalf("setup: keys %+v", good.Keys)
	}
	readErr := errors.New("disk gone")
	cases := []struct {
		name string
		next func() (*CheckpointSegment, error)
	}{
		{"no segments", checkpointSegmentsOf(nil)},
		{"no last segment", checkpointSegmentsOf(with(func(s *CheckpointSegment) { s.Last = false }))},
		{"segment 1 first", checkpointSegmentsOf(with(func(s *CheckpointSegment) { s.Part = 1; s.State = CheckpointState{} }))},
		{"totals differ", func() func() (*CheckpointSegment, error) {
			segs := split(3)
			segs[1].TotalBlocks++
			return checkpointSegmentsOf(segs)
		}()},
		{"a state in part 1", func() func() (*CheckpointSegment, error) {
			segs := split(3)
			segs[1].State.LastReset = "x"
			return checkpointSegmentsOf(segs)
		}()},
		{"fewer keys than the total", checkpointSegmentsOf(with(func(s *CheckpointSegment) { s.Total++ }))},
		{"more blocks than the total", checkpointSegmentsOf(with(func(s *CheckpointSegment) { s.TotalBlocks-- }))},
		{"a segment after the last", checkpointSegmentsOf(append(with(func(*CheckpointSegment) {}), &CheckpointSegment{Part: 1}))},
		{"a nil segment", checkpointSegmentsOf([]*CheckpointSegment{nil})},
		{"too many keys", checkpointSegmentsOf(with(func(s *CheckpointSegment) {
			for i := range CheckpointSegmentKeys {
				s.Keys = append(s.Keys, CheckpointKey{Key: Key(i + 10000)})
			}
			s.Total = uint64(len(s.Keys))
		}))},
		{"a key twice", checkpointSegmentsOf(with(func(s *CheckpointSegment) {
			s.Keys = append(s.Keys, s.Keys[5])
			s.Blocks = append(s.Blocks, CheckpointBlock{Hash: 12345, Refs: [events.NumMedia]uint8{gpu: 1}})
			s.Total++
			s.TotalBlocks++
		}))},
		{"an engine hash twice", checkpointSegmentsOf(with(func(s *CheckpointSegment) { s.Blocks[3].Hash = s.Blocks[2].Hash }))},
		{"a parent after its key", checkpointSegmentsOf(with(func(s *CheckpointSegment) {
			s.Keys[3], s.Keys[4] = s.Keys[4], s.Keys[3]
		}))},
		{"a key under an unknown parent", checkpointSegmentsOf(with(func(s *CheckpointSegment) { s.Keys[3].Parent = 999 }))},
		{"a placeholder not followed by its child", checkpointSegmentsOf(with(func(s *CheckpointSegment) {
			s.Keys = slices.Insert(s.Keys, 1, CheckpointKey{Key: 4444})
			s.Total++
		}))},
		{"a placeholder last", checkpointSegmentsOf(with(func(s *CheckpointSegment) {
			s.Keys = append(s.Keys, CheckpointKey{Key: 777, Parent: s.Keys[5].Key, HasParent: true})
			s.Total++
		}))},
		{"a block in no medium", checkpointSegmentsOf(with(func(s *CheckpointSegment) { s.Blocks[2].Refs = [events.NumMedia]uint8{} }))},
		{"blocks do not add up", checkpointSegmentsOf(with(func(s *CheckpointSegment) { s.Keys[2].Blocks++ }))},
		{"another digest", checkpointSegmentsOf(with(func(s *CheckpointSegment) { s.Digest++ }))},
		{"a block in another medium", checkpointSegmentsOf(with(func(s *CheckpointSegment) {
			s.Blocks[3].Refs = [events.NumMedia]uint8{cpu: 1}
		}))},
		{"a negative learned capacity", checkpointSegmentsOf(with(func(s *CheckpointSegment) { s.State.Learned[cpu] = -1 }))},
		{"a reader's error", func() (*CheckpointSegment, error) { return nil, readErr }},
	}
	for _, tc := range cases {
		err := rep.RestoreCheckpoint(tc.next)
		want := ErrBadCheckpoint
		if tc.name == "a reader's error" {
			want = readErr
		}
		if !errors.Is(err, want) {
			t.Fatalf("%s: error %v, want %v", tc.name, err, want)
		}
		if got := stateOf(rep, true); !reflect.DeepEqual(got, before) {
			t.Fatalf("%s: the worker changed", tc.name)
		}
	}
	// A valid split, and the restore replaces the worker's state.
	if err := rep.RestoreCheckpoint(checkpointSegmentsOf(split(3))); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(stateOf(rep, true), stateOf(ws[0], true)) || rep.Digest() != ws[0].Digest() {
		t.Fatal("the split checkpoint did not restore the worker")
	}
	if m := matchOf(rix, chainTokens(7, 3), nil, rep); m.Blocks != 0 {
		t.Fatalf("the replaced state still matches: %+v", m)
	}
	checkInvariants(t, rix)
	// An empty worker.
	_, es := newTestIndex(t, "e")
	segs := checkpointOf(t, es[0])
	if len(segs) != 1 || !segs[0].Last || len(segs[0].Keys) != 0 || segs[0].Digest != 0 {
		t.Fatalf("empty worker's checkpoint %+v", segs)
	}
	if err := rep.RestoreCheckpoint(checkpointSegmentsOf(segs)); err != nil || rep.Digest() != 0 || rep.Stats().ResidentBlocks != 0 {
		t.Fatalf("restore of nothing: %v, digest %#x, stats %+v", err, rep.Digest(), rep.Stats())
	}
	// Keyed and removed workers.
	_, keyed := newKeyedIndex(t, Config{})
	if err := keyed.Checkpoint(func(*CheckpointSegment) error { return nil }); !errors.Is(err, ErrWorkerKind) {
		t.Fatalf("checkpoint of a keyed worker: %v", err)
	}
	if err := keyed.RestoreCheckpoint(checkpointSegmentsOf(segs)); !errors.Is(err, ErrWorkerKind) {
		t.Fatalf("checkpoint restored into a keyed worker: %v", err)
	}
	if err := rix.RemoveWorker(rep.Info().Ref); err != nil {
		t.Fatal(err)
	}
	if err := rep.RestoreCheckpoint(checkpointSegmentsOf(segs)); !errors.Is(err, ErrRemovedWorker) {
		t.Fatalf("restore into a removed worker: %v", err)
	}
	if err := rep.Checkpoint(func(*CheckpointSegment) error { return nil }); !errors.Is(err, ErrRemovedWorker) {
		t.Fatalf("checkpoint of a removed worker: %v", err)
	}
	emitErr := errors.New("write failed")
	if err := ws[0].Checkpoint(func(*CheckpointSegment) error { return emitErr }); !errors.Is(err, emitErr) {
		t.Fatalf("checkpoint whose emit fails: %v", err)
	}
}

// FuzzCheckpointSegment checks that decoding never panics, that every
// error wraps ErrBadCheckpoint, and that a decoded segment survives
// encoding and decoding again.
func FuzzCheckpointSegment(f *testing.F) {
	b, _ := testCheckpointSegment().AppendBinary(nil)
	f.Add(b)
	e, _ := (&CheckpointSegment{}).AppendBinary(nil)
	f.Add(e)
	l, _ := (&CheckpointSegment{Part: 2, Keys: []CheckpointKey{{Key: 9, Blocks: 3}},
		Blocks: []CheckpointBlock{{Hash: 1, Refs: [events.NumMedia]uint8{gpu: 1}}, {Hash: 2, Refs: [events.NumMedia]uint8{cpu: 2}, Age: 3}, {Hash: 3, Refs: [events.NumMedia]uint8{5: 1}, Age: 3}}}).AppendBinary(nil)
	f.Add(l)
	f.Fuzz(func(t *testing.T, data []byte) {
		var s CheckpointSegment
		if err := s.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, ErrBadCheckpoint) {
				t.Fatalf("error %v does not wrap ErrBadCheckpoint", err)
			}
			return
		}
		again, err := s.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		var s2 CheckpointSegment
		if err := s2.UnmarshalBinary(again); err != nil {
			t.Fatalf("re-encoded segment does not decode: %v", err)
		}
		normCheckpointSegment(&s)
		normCheckpointSegment(&s2)
		if !reflect.DeepEqual(s, s2) {
			t.Fatalf("segment %+v became %+v", s, s2)
		}
	})
}

// TestRestoreTellsObservers: observers hear of a checkpoint restore, with
// what the worker holds after it, and of nothing when it fails.
func TestRestoreTellsObservers(t *testing.T) {
	_, sws := newTestIndex(t, "a")
	for i := range 5 {
		_ = apply(t, sws[0], stored(0, false, []uint64{uint64(1000 + i)}, seqTokens(100*i, 4)))
	}
	rix, rws := newTestIndex(t, "a")
	var got []Restored
	remove := rix.AddObserver(func(w *Worker, a *Applied) {
		if a.Restore != nil {
			got = append(got, *a.Restore)
		}
	})
	defer remove()
	if err := rws[0].RestoreCheckpoint(checkpointSegmentsOf(checkpointOf(t, sws[0]))); err != nil {
		t.Fatal(err)
	}
	if err := rws[0].RestoreCheckpoint(checkpointSegmentsOf(nil)); err == nil {
		t.Fatal("an empty checkpoint restored")
	}
	if len(got) != 1 || got[0] != (Restored{From: "checkpoint", Blocks: 5}) {
		t.Fatalf("observers heard %+v, want one checkpoint restore of 5 blocks", got)
	}
}
