package indexer

import (
	"errors"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/events"
)

func TestRemoveWorker(t *testing.T) {
	ix, ws := newTestIndex(t, "a", "b", "c")
	a, b, c := ws[0], ws[1], ws[2]
	shared := seqTokens(0, 16) // 4 blocks held by a and b
	for i, w := range []*Worker{a, b} {
		h := uint64(100 * (i + 1))
		if err := apply(t, w, stored(0, false, []uint64{h + 1, h + 2, h + 3, h + 4}, shared)); err != nil {
			t.Fatal(err)
		}
	}
	if err := apply(t, c, stored(0, false, []uint64{901}, seqTokens(500, 4))); err != nil {
		t.Fatal(err)
	}
	if err := ix.RemoveWorker(b.Info().Ref); err != nil {
		t.Fatal(err)
	}
	// b's blocks are gone; a still holds the shared prefix.
	keys := PromptKeys(testModel, 4, shared, nil, nil)
	got := ix.Match(keys, nil, nil)
	if len(got) != 1 || got[0].Worker != a.ID() || got[0].Blocks != 4 {
		t.Fatalf("after removing b: matches %+v, want only a with 4 blocks", got)
	}
	if ix.LookupWorker(b.Info().Ref) != nil || ix.Worker(b.ID()) != nil {
		t.Fatal("removed worker still found by ref or id")
	}
	if n := len(ix.Workers()); n != 2 {
		t.Fatalf("Workers() has %d workers, want 2", n)
	}
	// The old handle refuses events and changes nothing.
	err := apply(t, b, stored(0, false, []uint64{1}, seqTokens(0, 4)))
	if !errors.Is(err, ErrRemovedWorker) {
		t.Fatalf("apply to removed handle: %v, want ErrRemovedWorker", err)
	}
	b.Reset("late")
	b.SetCapacity(1)
	if got := ix.Match(keys, nil, nil); len(got) != 1 || got[0].Worker != a.ID() {
		t.Fatalf("removed handle changed the index: %+v", got)
	}
	if err := ix.RemoveWorker(b.Info().Ref); !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("second removal: %v, want ErrUnknownWorker", err)
	}

	// A new worker takes b's id with the next generation and starts empty.
	d, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "d"}, Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	if d.ID() != b.ID() || d.Gen() != b.Gen()+1 {
		t.Fatalf("new worker id %d gen %d, want id %d gen %d", d.ID(), d.Gen(), b.ID(), b.Gen()+1)
	}
	if st := d.Stats(); st.ResidentBlocks != 0 {
		t.Fatalf("reused id inherited %d blocks", st.ResidentBlocks)
	}
	for _, m := range ix.Match(keys, nil, nil) {
		if m.Worker == d.ID() {
			t.Fatalf("reused id matches the removed worker's blocks: %+v", m)
		}
	}
	// The same ref can come back too, as a fresh worker with a new id.
	b2, err := ix.AddWorker(WorkerInfo{Ref: b.Info().Ref, Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	if b2.ID() == b.ID() {
		t.Fatalf("re-added worker got id %d, which d holds", b2.ID())
	}
	if err := ix.Apply(b2.Info().Ref, &events.Batch{Events: []events.Event{stored(0, false, []uint64{7, 8}, seqTokens(0, 8))}}); err != nil {
		t.Fatal(err)
	}
	if m := matchOf(ix, shared, nil, b2); m.Blocks != 2 {
		t.Fatalf("re-added worker matches %d blocks, want 2", m.Blocks)
	}
	// Resident accounting covers only current workers: a 4, c 1, b2 2.
	if got := ix.resident.Load(); got != 7 {
		t.Fatalf("index resident = %d, want 7", got)
	}
}

func TestApplyByRefUnknown(t *testing.T) {
	ix, _ := newTestIndex(t, "a")
	err := ix.Apply(events.WorkerRef{Pod: "nope"}, &events.Batch{})
	if !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("Apply to unknown worker: %v, want ErrUnknownWorker", err)
	}
}

func TestVersionChangesOnAddAndRemove(t *testing.T) {
	ix, _ := newTestIndex(t, "a")
	v0 := ix.Version()
	if _, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "b"}, Model: testModel}); err != nil {
		t.Fatal(err)
	}
	v1 := ix.Version()
	if err := ix.RemoveWorker(events.WorkerRef{Pod: "b"}); err != nil {
		t.Fatal(err)
	}
	if v2 := ix.Version(); v0 == v1 || v1 == v2 {
		t.Fatalf("versions %d, %d, %d: want a change on each add and remove", v0, v1, v2)
	}
}

// TestRemoveWorkerUnderLoad removes and re-adds workers while others apply
// events on a shared prefix and readers match it: the survivors' matches
// stay exact throughout, and no reused id ever reports blocks.
func TestRemoveWorkerUnderLoad(t *testing.T) {
	ix, ws := newTestIndex(t, "keep0", "keep1")
	prefix := seqTokens(0, 32)
	keys := PromptKeys(testModel, 4, prefix, nil, nil)
	hashes := func(base uint64) []uint64 {
		h := make([]uint64, 8)
		for i := range h {
			h[i] = base + uint64(i)
		}
		return h
	}
	for i, w := range ws {
		if err := apply(t, w, stored(0, false, hashes(uint64(1000*(i+1))), prefix)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errc := make(chan error, 4)
	wg.Add(1)
	go func() { // readers: the two survivors always hold all 8 blocks
		defer wg.Done()
		var dst []Match
		for {
			select {
			case <-stop:
				return
			default:
			}
			dst = ix.Match(keys, nil, dst[:0])
			n := 0
			for _, m := range dst {
				if m.Worker == ws[0].ID() || m.Worker == ws[1].ID() {
					n++
					if m.Blocks != 8 {
						errc <- errors.New("survivor lost blocks")
						return
					}
				}
			}
			if n != 2 {
				errc <- errors.New("survivor missing from matches")
				return
			}
		}
	}()
	for round := range 200 {
		ref := events.WorkerRef{Pod: "churn", DPRank: round % 3}
		w, err := ix.AddWorker(WorkerInfo{Ref: ref, Model: testModel})
		if err != nil {
			t.Fatal(err)
		}
		if err := apply(t, w, stored(0, false, hashes(uint64(10_000+round*10)), prefix)); err != nil {
			t.Fatal(err)
		}
		if err := ix.RemoveWorker(ref); err != nil {
			t.Fatal(err)
		}
		// The freed id, reused at once, never inherits the prefix.
		w2, err := ix.AddWorker(WorkerInfo{Ref: ref, Model: testModel})
		if err != nil {
			t.Fatal(err)
		}
		if m := matchOf(ix, prefix, nil, w2); m.Blocks != 0 {
			t.Fatalf("round %d: reused id %d gen %d matches %d blocks", round, w2.ID(), w2.Gen(), m.Blocks)
		}
		if err := ix.RemoveWorker(ref); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	if n := ix.NumWorkers(); n > 4 {
		t.Fatalf("id space grew to %d for 2 workers plus 1 churning: ids are not reused", n)
	}
}
