package fleet

import (
	"reflect"
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

// TestConvertHybrid: a hybrid model's deltas (a full-attention anchor and
// a sliding-window side group announcing the same hashes, then window
// removals, then a new engine describing the window anew) survive ToWire
// and fromWire unchanged, layout included, and a keyed worker fed them
// holds what the source holds: digest, groups and capped hits.
func TestConvertHybrid(t *testing.T) {
	const bs = 4
	mk := func(keyed bool) *indexer.Worker {
		ix := indexer.New(indexer.Config{})
		if _, err := ix.AddModel("m", bs); err != nil {
			t.Fatal(err)
		}
		w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "p"}, Model: "m", Keyed: keyed})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	src, dst := mk(false), mk(true)
	toks := make([]uint32, 6*bs)
	for i := range toks {
		toks[i] = uint32(1000 + i)
	}
	hashes := []uint64{11, 12, 13, 14, 15, 16}
	store := func(group int, kind string, window int) events.Event {
		return events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: toks, BlockSize: bs, MediumName: "GPU",
			GroupIdx: group, HasGroupIdx: true, SpecKind: kind, SlidingWindow: window, HasSlidingWindow: window > 0}
	}
	removeWindow := events.Event{Kind: events.KindBlockRemoved, BlockHashes: hashes[2:4], MediumName: "GPU", GroupIdx: 1, HasGroupIdx: true}
	batches := []struct {
		name   string
		evs    []events.Event
		reset  bool
		layout bool
	}{
		{name: "both groups store", evs: []events.Event{store(0, "full_attention", 0), store(1, "sliding_window", 2*bs)}, layout: true},
		{name: "window removals", evs: []events.Event{removeWindow}},
		{name: "engine restart", reset: true},
		{name: "a wider window", evs: []events.Event{store(0, "full_attention", 0), store(1, "sliding_window", 3*bs)}, layout: true},
	}
	var d, back indexer.Delta
	var wire events.Delta
	for i, b := range batches {
		d.Reset()
		wire.Reset()
		d.Seq = uint64(i + 1)
		if b.reset {
			src.ResetDelta("engine restarted", &d)
		} else if err := src.ApplyBatchDelta(&events.Batch{Events: b.evs}, &d); err != nil {
			t.Fatalf("%s: %v", b.name, err)
		}
		ToWire(&d, &wire)
		fromWire(&wire, d.Seq, &back)
		if (len(d.Layout) > 0) != b.layout {
			t.Fatalf("%s: layout %+v", b.name, d.Layout)
		}
		if !reflect.DeepEqual(d.Entries, back.Entries) || !reflect.DeepEqual(d.Layout, back.Layout) || d.Seq != back.Seq {
			t.Fatalf("%s: converted\n%+v %+v\nback as\n%+v %+v", b.name, d.Entries, d.Layout, back.Entries, back.Layout)
		}
		if err := dst.ApplyDelta(&back); err != nil {
			t.Fatalf("%s: %v", b.name, err)
		}
		if src.Digest() != dst.Digest() || !reflect.DeepEqual(src.Groups(), dst.Groups()) {
			t.Fatalf("%s: source digest %x groups %+v, replica %x %+v", b.name, src.Digest(), src.Groups(), dst.Digest(), dst.Groups())
		}
	}
	// The wider window (3 blocks) holds every block again: no cap. After
	// its blocks 2 and 3 go, a hit of 6 blocks needs 3..5 and falls to
	// the run from the first block, 2 blocks, on both workers.
	d.Reset()
	if err := src.ApplyBatchDelta(&events.Batch{Events: []events.Event{removeWindow}}, &d); err != nil {
		t.Fatal(err)
	}
	wire.Reset()
	ToWire(&d, &wire)
	fromWire(&wire, 5, &back)
	if err := dst.ApplyDelta(&back); err != nil {
		t.Fatal(err)
	}
	keys := indexer.PromptKeys("m", bs, toks, nil, nil)
	for _, w := range []*indexer.Worker{src, dst} {
		if tok, by := w.Cap(6*bs, 6*bs, func(int) []indexer.Key { return keys }); tok != 2*bs || by != 1 {
			t.Fatalf("keyed %v: Cap %d tokens by group %d, want %d by 1", w.Info().Keyed, tok, by, 2*bs)
		}
	}
}
