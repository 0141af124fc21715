package indexer_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

func inspectFixture(t *testing.T, cfg indexer.Config) (*indexer.Index, *indexer.Model, []*indexer.Worker, []uint32) {
	t.Helper()
	ix := indexer.New(cfg)
	m, err := ix.AddModel("m", 4)
	if err != nil {
		t.Fatal(err)
	}
	var ws []*indexer.Worker
	for _, p := range []string{"a", "b"} {
		w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: p}, Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	prompt := make([]uint32, 16) // 4 blocks
	for i := range prompt {
		prompt[i] = uint32(100 + i)
	}
	return ix, m, ws, prompt
}

func stored(hashes []uint64, parent uint64, tokens []uint32, lora string) *events.Batch {
	return &events.Batch{Events: []events.Event{{
		Kind: events.KindBlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: parent != 0,
		TokenIDs: tokens, BlockSize: 4, LoRAName: lora,
	}}}
}

// TestLookupRuns checks Lookup's runs of holders along a prompt held in
// part by two workers, one of them in two media for a stretch.
func TestLookupRuns(t *testing.T) {
	ix, m, ws, prompt := inspectFixture(t, indexer.Config{})
	if err := ws[0].ApplyBatch(stored([]uint64{1, 2, 3, 4}, 0, prompt, "")); err != nil {
		t.Fatal(err)
	}
	if err := ws[1].ApplyBatch(stored([]uint64{21, 22}, 0, prompt[:8], "")); err != nil {
		t.Fatal(err)
	}
	keys := m.PromptKeys(append(slices.Clone(prompt), 1, 2, 3, 4), nil, nil) // 5 blocks, the last unknown
	type run struct {
		from, to int
		held     []indexer.Holder
	}
	var got []run
	n := ix.Lookup(keys, func(from, to int, held []indexer.Holder) bool {
		got = append(got, run{from, to, slices.Clone(held)})
		return true
	})
	if n != 4 {
		t.Fatalf("Lookup found %d keys, want 4", n)
	}
	gpu := uint8(1 << events.MediumGPU)
	want := []run{
		{0, 2, []indexer.Holder{{Worker: ws[0].ID(), Media: gpu}, {Worker: ws[1].ID(), Media: gpu}}},
		{2, 4, []indexer.Holder{{Worker: ws[0].ID(), Media: gpu}}},
	}
	if len(got) != len(want) {
		t.Fatalf("runs %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].from != want[i].from || got[i].to != want[i].to || !slices.Equal(got[i].held, want[i].held) {
			t.Fatalf("run %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestResidentPagesAndDigest pages through a worker's keys and checks the
// digest is Digest's, and the pages cover every key once in order.
func TestResidentPagesAndDigest(t *testing.T) {
	_, m, ws, prompt := inspectFixture(t, indexer.Config{})
	if err := ws[0].ApplyBatch(stored([]uint64{1, 2, 3, 4}, 0, prompt, "")); err != nil {
		t.Fatal(err)
	}
	var all []indexer.ResidentKey
	var after indexer.Key
	has := false
	for {
		page, total, d := ws[0].Resident(after, has, 3)
		if total != 4 || d != ws[0].Digest() {
			t.Fatalf("total %d digest %x, want 4 and %x", total, d, ws[0].Digest())
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		after, has = page[len(page)-1].Key, true
	}
	keys := m.PromptKeys(prompt, nil, nil)
	slices.Sort(keys)
	if len(all) != 4 {
		t.Fatalf("pages hold %d keys, want 4", len(all))
	}
	for i, r := range all {
		if r.Key != keys[i] || r.Media != 1<<events.MediumGPU {
			t.Fatalf("key %d: %+v, want %x on GPU", i, r, keys[i])
		}
	}
}

// TestEngineBlocksAndRemovals checks where engine hashes sit, the removal
// record, the adapters record, and the observer.
func TestEngineBlocksAndRemovals(t *testing.T) {
	ix, m, ws, prompt := inspectFixture(t, indexer.Config{RemovalHistory: 2})
	var seen []string
	stop := ix.AddObserver(func(w *indexer.Worker, a *indexer.Applied) {
		switch {
		case a.Batch != nil:
			seen = append(seen, w.Info().Ref.Pod+":"+a.Batch.Events[0].Kind.String())
		case a.Reset != "":
			seen = append(seen, w.Info().Ref.Pod+":reset "+a.Reset)
		}
	})
	if err := ws[0].ApplyBatch(stored([]uint64{1, 2, 3, 4}, 0, prompt, "")); err != nil {
		t.Fatal(err)
	}
	keys := m.PromptKeys(prompt, nil, nil)
	ebs, err := ws[0].EngineBlocks([]uint64{1, 3, 99}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !ebs[0].Found || ebs[0].Key != keys[0] || ebs[0].HasParent {
		t.Fatalf("block 1: %+v, want key %x at top level", ebs[0], keys[0])
	}
	if !ebs[1].Found || ebs[1].Key != keys[2] || !ebs[1].HasParent || ebs[1].Parent != keys[1] {
		t.Fatalf("block 3: %+v, want key %x under %x", ebs[1], keys[2], keys[1])
	}
	if ebs[2].Found {
		t.Fatalf("hash 99 found: %+v", ebs[2])
	}
	// Three removals into a record of two: the oldest is forgotten.
	for _, h := range []uint64{4, 3, 2} {
		if err := ws[0].ApplyBatch(&events.Batch{Events: []events.Event{{Kind: events.KindBlockRemoved, BlockHashes: []uint64{h}}}}); err != nil {
			t.Fatal(err)
		}
	}
	if r, n, ok := ws[0].FindRemoval(keys[2]); !ok || n != 2 || r.Cause != indexer.CauseRemoved || r.At.IsZero() {
		t.Fatalf("FindRemoval(block 2) = %+v %d %v, want removed, record of 2", r, n, ok)
	}
	if _, _, ok := ws[0].FindRemoval(keys[3]); ok {
		t.Fatal("block 3's removal is still in a record of 2")
	}
	ws[1].Reset("test restart")
	stop()
	ws[1].Reset("unseen")
	if err := ws[1].ApplyBatch(stored([]uint64{7}, 0, prompt[:4], "adapter-x")); err != nil {
		t.Fatal(err)
	}
	if l, over := ws[1].LoRAs(); !slices.Equal(l, []string{"adapter-x"}) || over {
		t.Fatalf("LoRAs %v %v, want [adapter-x]", l, over)
	}
	want := []string{"a:BlockStored", "a:BlockRemoved", "a:BlockRemoved", "a:BlockRemoved", "b:reset test restart"}
	if !slices.Equal(seen, want) {
		t.Fatalf("observed %q, want %q", seen, want)
	}
	if st := ws[1].Stats(); st.LastResetAt.IsZero() {
		t.Fatal("LastResetAt not set by Reset")
	}
	keyed, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "k"}, Model: "m", Keyed: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keyed.EngineBlocks([]uint64{1}, nil); !errors.Is(err, indexer.ErrWorkerKind) {
		t.Fatalf("keyed EngineBlocks: %v, want ErrWorkerKind", err)
	}
}

// TestKeyedWorkerObservedAndRecorded: a replica's keyed worker applying a
// source's deltas is observed (Applied.Delta), records the removals they
// carry, and dumps the source's keys with its digest.
func TestKeyedWorkerObservedAndRecorded(t *testing.T) {
	_, m, ws, prompt := inspectFixture(t, indexer.Config{})
	src := ws[0]
	rix := indexer.New(indexer.Config{})
	if _, err := rix.AddModel("m", 4); err != nil {
		t.Fatal(err)
	}
	rep, err := rix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "a"}, Model: "m", Keyed: true})
	if err != nil {
		t.Fatal(err)
	}
	deltas := 0
	defer rix.AddObserver(func(w *indexer.Worker, a *indexer.Applied) {
		if a.Delta != nil && w == rep {
			deltas++
		}
	})()
	var d indexer.Delta
	if err := src.ApplyBatchDelta(stored([]uint64{1, 2, 3, 4}, 0, prompt, ""), &d); err != nil {
		t.Fatal(err)
	}
	if err := rep.ApplyDelta(&d); err != nil {
		t.Fatal(err)
	}
	d.Reset()
	if err := src.ApplyBatchDelta(&events.Batch{Events: []events.Event{{Kind: events.KindBlockRemoved, BlockHashes: []uint64{4}}}}, &d); err != nil {
		t.Fatal(err)
	}
	if err := rep.ApplyDelta(&d); err != nil {
		t.Fatal(err)
	}
	keys := m.PromptKeys(prompt, nil, nil)
	if r, _, ok := rep.FindRemoval(keys[3]); !ok || r.Cause != indexer.CauseRemoved {
		t.Fatalf("replica's record of block 3: %+v %v", r, ok)
	}
	page, total, digest := rep.Resident(0, false, -1)
	if deltas != 2 || total != 3 || len(page) != 3 || digest != src.Digest() {
		t.Fatalf("deltas %d, replica %d keys (%d listed), digest %x vs source %x", deltas, total, len(page), digest, src.Digest())
	}
}
