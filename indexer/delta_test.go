package indexer

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// newKeyedIndex returns an index of testModel with one keyed worker.
func newKeyedIndex(t *testing.T, cfg Config) (*Index, *Worker) {
	t.Helper()
	ix := New(cfg)
	if _, err := ix.AddModel(testModel, 4); err != nil {
		t.Fatal(err)
	}
	w, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "replica"}, Model: testModel, Keyed: true})
	if err != nil {
		t.Fatal(err)
	}
	return ix, w
}

// offload is a BlockStored event without tokens: the blocks are now in m
// too.
func offload(m events.Medium, hashes ...uint64) events.Event {
	return events.Event{Kind: events.KindBlockStored, Medium: m, BlockHashes: hashes}
}

const (
	gpu = events.MediumGPU
	cpu = events.MediumCPU
)

func refsIn(pairs ...int) [events.NumMedia]uint8 {
	var r [events.NumMedia]uint8
	for i := 0; i < len(pairs); i += 2 {
		r[pairs[i]] = uint8(pairs[i+1])
	}
	return r
}

// TestDeltaRecordsEffects checks the effects ApplyBatchDelta, ResetDelta
// and SetCapacityDelta record, entry by entry: stores of new blocks (with
// their parents, top level for a chain's first), a duplicate store, an
// offload (of a key inside its node and of a top-level one), removals
// that end a block, a medium or neither, a new alias of a held key, a
// hash reused for other content (the store recorded before the drop),
// clears, and capacity evictions; and that a keyed replica fed them holds
// what the source holds after each step.
func TestDeltaRecordsEffects(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	rix, rep := newKeyedIndex(t, Config{Shards: 4})
	k := PromptKeys(testModel, 4, chainTokens(0, 4), nil, nil)
	kx := PromptKeys(testModel, 4, seqTokens(500, 4), nil, nil)[0]
	var d Delta
	seq := uint64(0)
	check := func(what string, got, want []DeltaEntry) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%s: recorded\n %+v\nwant\n %+v", what, got, want)
		}
		if err := rep.ApplyDelta(&d); err != nil {
			t.Fatalf("%s: replica: %v", what, err)
		}
		checkReplica(t, ix, rix, w, rep, [][]Key{k, k[:2], {kx}}, what)
		if got := rep.DeltaSeq(); got != seq {
			t.Fatalf("%s: replica at seq %d, want %d", what, got, seq)
		}
	}
	rec := func(evs ...events.Event) []DeltaEntry {
		t.Helper()
		seq++
		d.Reset()
		d.Seq = seq
		if err := w.ApplyBatchDelta(&events.Batch{Events: evs}, &d); err != nil {
			t.Fatal(err)
		}
		if got := w.DeltaSeq(); got != seq {
			t.Fatalf("source at seq %d, want %d", got, seq)
		}
		return slices.Clone(d.Entries)
	}
	store := func(key, parent Key, hasParent bool, m events.Medium, block, medium bool) DeltaEntry {
		return DeltaEntry{Op: OpStore, Key: key, Parent: parent, HasParent: hasParent, Medium: m, BlockEdge: block, MediumEdge: medium}
	}
	remove := func(key Key, m events.Medium, block, medium bool) DeltaEntry {
		return DeltaEntry{Op: OpRemove, Key: key, Medium: m, BlockEdge: block, MediumEdge: medium}
	}

	check("new chain", rec(chain(1, 0, 0, 3)), []DeltaEntry{
		store(k[0], 0, false, gpu, true, true), store(k[1], k[0], true, gpu, true, true), store(k[2], k[1], true, gpu, true, true)})
	check("stored again", rec(chain(1, 0, 0, 2)), []DeltaEntry{
		store(k[0], 0, false, gpu, false, false), store(k[1], k[0], true, gpu, false, false)})
	check("offload", rec(offload(cpu, 2, 1)), []DeltaEntry{
		store(k[1], k[0], true, cpu, false, true), store(k[0], 0, false, cpu, false, true)})
	check("remove a block", rec(removed(gpu, 3)), []DeltaEntry{remove(k[2], gpu, true, true)})
	check("remove one of two stores", rec(removed(gpu, 1)), []DeltaEntry{remove(k[0], gpu, false, false)})
	check("remove a medium", rec(removed(cpu, 1)), []DeltaEntry{remove(k[0], cpu, false, true)})
	check("alias", rec(stored(0, false, []uint64{99}, seqTokens(0, 4))), []DeltaEntry{store(k[0], 0, false, gpu, true, true)})
	check("hash reused", rec(stored(0, false, []uint64{2}, seqTokens(500, 4))), []DeltaEntry{
		store(kx, 0, false, gpu, true, true), {Op: OpDrop, Key: k[1], Refs: refsIn(int(gpu), 2, int(cpu), 1)}})
	check("parent's hash reused", rec(stored(2, true, []uint64{2}, seqTokens(600, 4))), []DeltaEntry{
		store(PromptKeys(testModel, 4, append(seqTokens(500, 4), seqTokens(600, 4)...), nil, nil)[1], kx, true, gpu, true, true),
		{Op: OpDrop, Key: kx, Refs: refsIn(int(gpu), 1)}})
	check("clear", rec(events.Event{Kind: events.KindAllBlocksCleared}), []DeltaEntry{{Op: OpClear}})

	rec(chain(1, 0, 0, 3))
	check("chain again", d.Entries, []DeltaEntry{
		store(k[0], 0, false, gpu, true, true), store(k[1], k[0], true, gpu, true, true), store(k[2], k[1], true, gpu, true, true)})
	seq++
	d.Reset()
	d.Seq = seq
	w.SetCapacityDelta(1, &d)
	check("capacity", slices.Clone(d.Entries), []DeltaEntry{
		{Op: OpDrop, Key: k[0], Refs: refsIn(int(gpu), 1)}, {Op: OpDrop, Key: k[1], Refs: refsIn(int(gpu), 1)}})
	if got := w.Stats().Evictions; got != 2 {
		t.Fatalf("source evicted %d blocks, want 2", got)
	}
	seq++
	d.Reset()
	d.Seq = seq
	w.ResetDelta("restart", &d)
	check("reset", slices.Clone(d.Entries), []DeltaEntry{{Op: OpClear}})
	if s := rep.Stats(); s.ResidentBlocks != 0 || s.Evictions != 0 || s.Capacity != 0 {
		t.Fatalf("replica stats %+v: want empty, with no evictions or capacity of its own", s)
	}
}

// TestReplicaSumsAliasesAndDups builds a key held by two blocks of the
// source (an alias), one of them stored twice, and checks that the
// replica's one entry has the summed counts (as its snapshot shows) and
// that removals then end the key exactly when the source's last block
// there goes.
func TestReplicaSumsAliasesAndDups(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	rix, rep := newKeyedIndex(t, Config{Shards: 4})
	k := PromptKeys(testModel, 4, chainTokens(0, 1), nil, nil)[0]
	var d Delta
	step := func(what string, evs ...events.Event) {
		t.Helper()
		d.Reset()
		if err := w.ApplyBatchDelta(&events.Batch{Events: evs}, &d); err != nil {
			t.Fatal(err)
		}
		if err := rep.ApplyDelta(&d); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		checkReplica(t, ix, rix, w, rep, [][]Key{{k}}, what)
	}
	step("stores", chain(1, 0, 0, 1), chain(1, 0, 0, 1), stored(0, false, []uint64{7}, seqTokens(0, 4)), offload(cpu, 7))
	segs := snapshotOf(t, rep)
	want := SnapshotKey{Key: k, Blocks: 2, BlocksIn: [events.NumMedia]uint32{gpu: 2, cpu: 1}, Refs: [events.NumMedia]uint32{gpu: 3, cpu: 1}}
	if len(segs) != 1 || len(segs[0].Keys) != 1 || segs[0].Keys[0] != want {
		t.Fatalf("replica's snapshot %+v, want the one key %+v", segs, want)
	}
	if src := snapshotOf(t, w); !reflect.DeepEqual(src, segs) {
		t.Fatalf("source's snapshot %+v, replica's %+v", src, segs)
	}
	step("one store of two", removed(gpu, 1))
	step("the alias's GPU store", removed(gpu, 7))
	if m := matchOf(rix, chainTokens(0, 1), nil, rep); m.Blocks != 1 || m.ByMedium[gpu] != 1 || m.ByMedium[cpu] != 1 {
		t.Fatalf("replica's match %+v: want the key in GPU and CPU", m)
	}
	step("the last GPU store", removed(gpu, 1))
	if m := matchOf(rix, chainTokens(0, 1), nil, rep); m.Blocks != 1 || m.ByMedium[gpu] != 0 || m.ByMedium[cpu] != 1 {
		t.Fatalf("replica's match %+v: want the key in CPU only", m)
	}
	step("the last store", removed(cpu, 7))
	if s := rep.Stats(); s.ResidentBlocks != 0 || rep.Digest() != 0 {
		t.Fatalf("replica stats %+v, digest %#x: want empty", s, rep.Digest())
	}
	checkInvariants(t, rix)
}

// TestApplyDeltaMismatches feeds a keyed worker effects that do not fit
// its state among ones that do: each misfit is skipped and counted, the
// rest apply, and the error wraps ErrDeltaMismatch with the count and the
// first misfit.
func TestApplyDeltaMismatches(t *testing.T) {
	rix, rep := newKeyedIndex(t, Config{Shards: 4})
	k := PromptKeys(testModel, 4, chainTokens(0, 4), nil, nil)
	first := func(key, parent Key, hasParent bool) DeltaEntry {
		return DeltaEntry{Op: OpStore, Key: key, Parent: parent, HasParent: hasParent, BlockEdge: true, MediumEdge: true}
	}
	d := Delta{Seq: 7, Entries: []DeltaEntry{
		first(k[1], k[0], true), // misfit: the parent is not held
		first(k[0], 0, false),
		first(k[1], k[0], true),
		{Op: OpRemove, Key: k[2], BlockEdge: true, MediumEdge: true},              // misfit: not held
		{Op: OpRemove, Key: k[1], Medium: cpu, BlockEdge: true, MediumEdge: true}, // misfit: no store in CPU
		{Op: OpDrop, Key: k[0], Refs: refsIn(int(gpu), 2)},                        // misfit: one store held
		{Op: OpStore, Key: k[0]},                                                 // a second store of k[0]'s block
		{Op: OpStore, Key: k[3], Parent: k[1], HasParent: true},                  // misfit: not held, not a new block
		{Op: OpStore, Key: k[2], Parent: k[1], HasParent: true, BlockEdge: true}, // misfit: edges
		{Op: DeltaOp(9), Key: k[0]},                                              // misfit: unknown op
		{Op: OpStore, Key: k[0], Medium: events.Medium(7)},                       // misfit: unknown medium
		{Op: OpRemove, Key: k[0], MediumEdge: true},                              // misfit: leaves a store in no block
	}}
	err := rep.ApplyDelta(&d)
	if !errors.Is(err, ErrDeltaMismatch) {
		t.Fatalf("error %v, want ErrDeltaMismatch", err)
	}
	for _, want := range []string{"9 of 12 effects skipped", "effect 0 (store of key", "does not hold the parent key", "delta 7"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not say %q", err, want)
		}
	}
	s := rep.Stats()
	if s.DeltaMismatches != 9 || s.ResidentBlocks != 2 || s.ResidentByMedium[gpu] != 2 || rep.DeltaSeq() != 7 {
		t.Fatalf("stats %+v, seq %d: want 9 mismatches, 2 blocks in GPU, seq 7", s, rep.DeltaSeq())
	}
	// The same as a source that stored k[0] twice and k[1] once.
	ix, ws := newTestIndex(t, "a")
	if err := apply(t, ws[0], chain(1, 0, 0, 2), chain(1, 0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if a, b := ws[0].Digest(), rep.Digest(); a != b {
		t.Fatalf("digest %#x, source's %#x", b, a)
	}
	if got, want := sortMatches(rix.Match(k, nil, nil)), sortMatches(ix.Match(k, nil, nil)); !reflect.DeepEqual(got, want) {
		t.Fatalf("Match %+v, source's %+v", got, want)
	}
	seg := snapshotOf(t, rep)[0]
	if got := seg.Keys[0]; got.Key != k[0] || got.Refs[gpu] != 2 || got.Blocks != 1 {
		t.Fatalf("replica's first key %+v: want k[0], one block stored twice in GPU", got)
	}
	checkInvariants(t, rix)
}

// TestWorkerKinds checks that keyed workers refuse engine events and
// workers fed engine events refuse deltas and snapshots, with
// ErrWorkerKind, changing nothing.
func TestWorkerKinds(t *testing.T) {
	_, ws := newTestIndex(t, "a")
	_, rep := newKeyedIndex(t, Config{})
	var d Delta
	if err := rep.ApplyBatch(&events.Batch{Events: []events.Event{chain(1, 0, 0, 2)}}); !errors.Is(err, ErrWorkerKind) {
		t.Fatalf("ApplyBatch on a keyed worker: %v", err)
	}
	if err := rep.ApplyBatchDelta(&events.Batch{Events: []events.Event{chain(1, 0, 0, 2)}}, &d); !errors.Is(err, ErrWorkerKind) || len(d.Entries) != 0 {
		t.Fatalf("ApplyBatchDelta on a keyed worker: %v, %d effects", err, len(d.Entries))
	}
	d.Entries = []DeltaEntry{{Op: OpClear}}
	if err := ws[0].ApplyDelta(&d); !errors.Is(err, ErrWorkerKind) {
		t.Fatalf("ApplyDelta on a worker fed engine events: %v", err)
	}
	if err := ws[0].Restore(segmentsOf(nil)); !errors.Is(err, ErrWorkerKind) {
		t.Fatalf("Restore on a worker fed engine events: %v", err)
	}
	if rep.Stats().ResidentBlocks != 0 || rep.Stats().DeltaMismatches != 0 || rep.DeltaSeq() != 0 {
		t.Fatalf("keyed worker changed: %+v", rep.Stats())
	}
}

// TestKeyedWorkerBudget checks that the memory budget evicts from a keyed
// worker as from any (counted, the index's resident count kept exact),
// that it has no capacity of its own, and that effects on evicted keys
// are then misfits.
func TestKeyedWorkerBudget(t *testing.T) {
	_, ws := newTestIndex(t, "a")
	src := ws[0]
	rix, rep := newKeyedIndex(t, Config{Shards: 4, WorkerCapacity: 2, MemoryBudget: 64 * EstimatedBytesPerBlock})
	rep.SetCapacity(3)
	var d Delta
	if err := src.ApplyBatchDelta(&events.Batch{Events: []events.Event{chain(1, 0, 0, 100)}}, &d); err != nil {
		t.Fatal(err)
	}
	if err := rep.ApplyDelta(&d); err != nil {
		t.Fatal(err)
	}
	s := rep.Stats()
	if s.BudgetEvictions == 0 || s.Evictions != s.BudgetEvictions || s.ResidentBlocks != 100-s.Evictions || s.Capacity != 0 {
		t.Fatalf("replica stats %+v: want budget evictions only, no capacity", s)
	}
	if got := rix.resident.Load(); got != s.ResidentBlocks {
		t.Fatalf("index counts %d resident blocks, the worker %d", got, s.ResidentBlocks)
	}
	d.Reset()
	if err := src.ApplyBatchDelta(&events.Batch{Events: []events.Event{removed(gpu, 1)}}, &d); err != nil {
		t.Fatal(err)
	}
	if err := rep.ApplyDelta(&d); !errors.Is(err, ErrDeltaMismatch) {
		t.Fatalf("removal of an evicted key: %v, want ErrDeltaMismatch", err)
	}
	checkInvariants(t, rix)
}

// TestDigest checks that digests depend on the keys and their media
// only: equal for one resident set reached in different orders, with
// different store counts or through an alias, different for another
// medium or key, 0 for nothing.
func TestDigest(t *testing.T) {
	_, ws := newTestIndex(t, "a", "b", "c")
	a, b, c := ws[0], ws[1], ws[2]
	if a.Digest() != 0 {
		t.Fatalf("empty worker's digest %#x", a.Digest())
	}
	apply(t, a, chain(1, 0, 0, 6), offload(cpu, 3))
	apply(t, b, chain(1, 0, 0, 2), chain(1, 0, 2, 6))
	apply(t, b, offload(cpu, 3), chain(1, 0, 0, 2)) // a second store of blocks 0-1
	if a.Digest() != b.Digest() {
		t.Fatalf("equal resident sets, digests %#x and %#x", a.Digest(), b.Digest())
	}
	apply(t, c, chain(1, 0, 0, 6), stored(0, false, []uint64{77}, seqTokens(0, 4)), offload(cpu, 3))
	if a.Digest() != c.Digest() {
		t.Fatalf("equal resident sets (one through an alias), digests %#x and %#x", a.Digest(), c.Digest())
	}
	apply(t, c, offload(cpu, 77))
	if a.Digest() == c.Digest() {
		t.Fatalf("a key in another medium, equal digests %#x", a.Digest())
	}
	apply(t, b, removed(gpu, 6))
	if a.Digest() == b.Digest() {
		t.Fatalf("a key less, equal digests %#x", a.Digest())
	}
}
