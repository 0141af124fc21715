package natsbus

import (
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/events"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

func randomDelta(r *rand.Rand, n int) *events.Delta {
	d := &events.Delta{}
	var prev uint64
	for range n {
		e := events.DeltaEntry{Op: events.DeltaOp(1 + r.IntN(4)), Key: r.Uint64(), Medium: events.Medium(r.IntN(events.NumMedia)), BlockEdge: r.IntN(2) == 0, MediumEdge: r.IntN(2) == 0}
		switch e.Op {
		case events.DeltaStore:
			switch r.IntN(3) {
			case 0: // chained
				if prev != 0 {
					e.Parent, e.HasParent = prev, true
				}
			case 1:
				e.Parent, e.HasParent = r.Uint64(), true
			}
		case events.DeltaDrop:
			e.Medium = 0
			for m := range e.Refs {
				e.Refs[m] = uint8(r.IntN(3))
			}
		case events.DeltaClear:
			e.Key, e.Medium = 0, 0
		}
		if e.Op != events.DeltaStore && e.Op != events.DeltaRemove {
			e.BlockEdge, e.MediumEdge = false, false
		}
		if e.Op == events.DeltaRemove {
			e.Parent = 0
		}
		d.Entries = append(d.Entries, e)
		prev = e.Key
		if e.Op == events.DeltaClear {
			prev = 0
		}
	}
	return d
}

// withSideGroups makes d a hybrid model's delta: about a third of its
// stores (made parentless) and removals become side groups' (1 to 4), and
// half the time it carries a layout.
func withSideGroups(r *rand.Rand, d *events.Delta) *events.Delta {
	for i := range d.Entries {
		e := &d.Entries[i]
		if (e.Op == events.DeltaStore || e.Op == events.DeltaRemove) && r.IntN(3) == 0 {
			e.Group = uint8(1 + r.IntN(4))
			e.Parent, e.HasParent = 0, false
		}
	}
	if r.IntN(2) == 0 {
		d.Layout = []events.KVGroup{
			{Index: 0, Kind: "full_attention", BlockSize: 16, Anchor: true},
			{Index: 1, Kind: "sliding_window", BlockSize: 16, Window: 128},
			{Index: 3, Kind: "mamba", BlockSize: 64 * r.IntN(3)},
		}
	}
	return d
}

// sameDelta reports whether two deltas have the same entries and layout
// (empty and nil alike).
func sameDelta(a, b *events.Delta) bool {
	return (len(a.Entries) == 0 && len(b.Entries) == 0 || reflect.DeepEqual(a.Entries, b.Entries)) &&
		(len(a.Layout) == 0 && len(b.Layout) == 0 || reflect.DeepEqual(a.Layout, b.Layout))
}

// Deltas survive encode, marshal, unmarshal and decode unchanged, side
// groups' entries and layouts included, and a chain of stores costs 9
// bytes a block (10 in a delta with side groups' entries).
func TestDeltaRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var m, back fleetv1.Delta
	var got events.Delta
	for i := range 1000 {
		d := randomDelta(r, r.IntN(40))
		if i%2 == 1 {
			d = withSideGroups(r, d)
		}
		encodeDelta(&m, deltaHeader{epoch: 7, seq: uint64(i + 1), engineSeq: 99, engineTime: 1.5}, d)
		b, err := proto.Marshal(&m)
		if err != nil {
			t.Fatal(err)
		}
		if err := unmarshalDelta(b, &back); err != nil {
			t.Fatal(err)
		}
		if back.Epoch != 7 || back.Seq != uint64(i+1) || back.EngineSeq != 99 || back.EngineTime != 1.5 {
			t.Fatalf("header %+v", &back)
		}
		if err := decodeDelta(&back, &got); err != nil {
			t.Fatal(err)
		}
		if !sameDelta(d, &got) {
			t.Fatalf("round trip:\n%+v %+v\n%+v %+v", d.Entries, d.Layout, got.Entries, got.Layout)
		}
		side := slices.ContainsFunc(d.Entries, func(e events.DeltaEntry) bool { return e.Group != 0 })
		if side != (len(back.Groups) > 0) || len(back.Layout) != len(d.Layout) {
			t.Fatalf("%d group bytes (side entries: %v) and %d layout groups for a layout of %d", len(back.Groups), side, len(back.Layout), len(d.Layout))
		}
	}
	chain := &events.Delta{}
	for i := range 100 {
		e := events.DeltaEntry{Op: events.DeltaStore, Key: uint64(1<<60 + i)}
		if i > 0 {
			e.Parent, e.HasParent = uint64(1<<60+i-1), true
		}
		chain.Entries = append(chain.Entries, e)
	}
	encodeDelta(&m, deltaHeader{epoch: 1, seq: 1}, chain)
	b, _ := proto.Marshal(&m)
	if per := float64(len(b)) / 100; per > 9.6 {
		t.Fatalf("a chain of 100 stores takes %.1f bytes a block, want about 9", per)
	}
	// A hybrid model's store of 100 blocks: the anchor's chain, then the
	// window group's keys of the same blocks.
	for i := range 100 {
		chain.Entries = append(chain.Entries, events.DeltaEntry{Op: events.DeltaStore, Key: uint64(1<<60 + i), Group: 2, BlockEdge: true, MediumEdge: true})
	}
	encodeDelta(&m, deltaHeader{epoch: 1, seq: 1}, chain)
	b, _ = proto.Marshal(&m)
	if per := float64(len(b)) / 200; per > 10.6 {
		t.Fatalf("a hybrid store of 100 blocks in two groups takes %.1f bytes an entry, want about 10", per)
	}
}

// goldenDelta is the wire form of randomDelta(PCG(5, 6), 24) with
// goldenHeader, as encoded before side groups had a wire form: a delta
// without side groups' entries or a layout must keep it byte for byte, so
// the fleet's bytes per block (docs/benchmarks.md, "Fleet benchmarks") stay.
const goldenDelta = "0890f1d9a2a302102a19000010e0a64ada4122181903122204030402040404110411030404032a1a122103042a7862e7fcb8" +
	"29ba115347fcc6bfa13e066d5e3fa95b5ac3e20265cf8cce4e04be6cfb7f34f4f1221b8aab4ec4d216a3ec9e4bab2b1604ed" +
	"e90003a4e40540c1ae8d7f5593c50a671c32076f5f77c6ac6cb381f468a33922642dcbe9afad84c7c4cec589987af8ee409f" +
	"749ca860c2eba0986491ea32b02b94963a1e0002010200020100000100010200020102000100000201010200020000014029" +
	"4a06e2c08000a009"

var goldenHeader = deltaHeader{epoch: 0x1234567890, seq: 42, engineSeq: 41, engineTime: 1764400000.25}

func TestDeltaWireUnchangedWithoutSideGroups(t *testing.T) {
	var m fleetv1.Delta
	// A message reused after a hybrid delta drops its groups and layout.
	encodeDelta(&m, goldenHeader, withSideGroups(rand.New(rand.NewPCG(7, 8)), randomDelta(rand.New(rand.NewPCG(7, 8)), 30)))
	encodeDelta(&m, goldenHeader, randomDelta(rand.New(rand.NewPCG(5, 6)), 24))
	b, err := proto.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(b); got != goldenDelta {
		t.Fatalf("a delta without side groups encodes to %d bytes\n%s\nwant %d bytes\n%s", len(b), got, len(goldenDelta)/2, goldenDelta)
	}
}

func TestDeltaMalformed(t *testing.T) {
	var d events.Delta
	for _, m := range []*fleetv1.Delta{
		{Ops: []byte{0}}, // op 0
		{Ops: []byte{byte(events.DeltaStore) | 6<<3}},                                            // medium 6
		{Ops: []byte{byte(events.DeltaStore)}},                                                   // no key
		{Ops: []byte{byte(events.DeltaStore) | parentPrevBit | hasParentBit}, Keys: []uint64{1}}, // no previous
		{Ops: []byte{byte(events.DeltaStore) | hasParentBit}, Keys: []uint64{1}},                 // no parent
		{Ops: []byte{byte(events.DeltaDrop)}, Keys: []uint64{1}, Refs: []byte{1}},                // short refs
		{Ops: []byte{byte(events.DeltaRemove) | hasParentBit}, Keys: []uint64{1}},                // parent on a removal
		{Ops: []byte{byte(events.DeltaClear)}, Keys: []uint64{1}},                                // spare key
	} {
		if err := decodeDelta(m, &d); !errors.Is(err, ErrMalformed) {
			t.Errorf("%+v: %v, want ErrMalformed", m, err)
		}
	}
	// Side groups: the groups column and the layout must agree with the
	// entries; the error names the entry or layout group at fault.
	store, drop, clr := byte(events.DeltaStore), byte(events.DeltaDrop), byte(events.DeltaClear)
	two := []byte{0x0f} // both entries' block and medium edges
	full := &fleetv1.KVCacheGroup{Index: 0, Kind: "full_attention", BlockSize: 16, Anchor: true}
	for _, c := range []struct {
		m    *fleetv1.Delta
		want string
	}{
		{&fleetv1.Delta{Ops: []byte{store, store}, Keys: []uint64{1, 2}, Edges: two, Groups: []byte{2}}, "1 group bytes for 2 entries"},
		{&fleetv1.Delta{Ops: []byte{store, store}, Keys: []uint64{1, 2}, Edges: two, Groups: []byte{0, 2, 2}}, "3 group bytes for 2 entries"},
		{&fleetv1.Delta{Ops: []byte{store, drop}, Keys: []uint64{1, 2}, Refs: make([]byte, events.NumMedia), Edges: two, Groups: []byte{0, 2}}, "entry 1: a DROP"},
		{&fleetv1.Delta{Ops: []byte{store, clr}, Keys: []uint64{1}, Edges: two, Groups: []byte{0, 2}}, "entry 1: a CLEAR"},
		{&fleetv1.Delta{Ops: []byte{store, store | hasParentBit}, Keys: []uint64{1, 2}, Parents: []uint64{1}, Edges: two, Groups: []byte{0, 2}}, "entry 1: a STORE (op byte 0x41) of side group 1"},
		{&fleetv1.Delta{Ops: []byte{store, store | hasParentBit | parentPrevBit}, Keys: []uint64{1, 2}, Edges: two, Groups: []byte{0, 3}}, "entry 1: a STORE (op byte 0xc1) of side group 2"},
		{&fleetv1.Delta{Layout: []*fleetv1.KVCacheGroup{full, {Index: 0, Kind: "mamba"}}}, "layout group 1: index 0 after 0"},
		{&fleetv1.Delta{Layout: []*fleetv1.KVCacheGroup{full, {Index: 255, Kind: "mamba"}}}, "layout group 1: index 255 past 254"},
		{&fleetv1.Delta{Layout: []*fleetv1.KVCacheGroup{{Index: 0, BlockSize: 1 << 31}}}, "layout group 0: block size 2147483648"},
		{&fleetv1.Delta{Layout: []*fleetv1.KVCacheGroup{{Index: 1, SlidingWindow: 1 << 31}}}, "layout group 0: block size 0, window 2147483648"},
	} {
		err := decodeDelta(c.m, &d)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want ErrMalformed saying %q", c.m, err, c.want)
		}
	}
	// A groups column of zeros only is allowed (an encoder need not omit
	// it) and names no group.
	if err := decodeDelta(&fleetv1.Delta{Ops: []byte{store}, Keys: []uint64{1}, Edges: []byte{3}, Groups: []byte{0}}, &d); err != nil || d.Entries[0].Group != 0 {
		t.Fatalf("a column of zeros: %v, %+v", err, d.Entries)
	}
	var m fleetv1.Delta
	if err := unmarshalDelta([]byte{0xff, 0xff}, &m); !errors.Is(err, ErrMalformed) {
		t.Errorf("garbage: %v", err)
	}
}

// FuzzDecodeDelta: no input makes the decoder panic, and what it accepts
// re-encodes to a message that decodes to the same entries and layout.
func FuzzDecodeDelta(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 16 {
		var m fleetv1.Delta
		d := randomDelta(r, 10)
		if i >= 8 {
			d = withSideGroups(r, d)
		}
		encodeDelta(&m, deltaHeader{epoch: 1, seq: 1}, d)
		b, _ := proto.Marshal(&m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m fleetv1.Delta
		var d events.Delta
		if unmarshalDelta(b, &m) != nil || decodeDelta(&m, &d) != nil {
			return
		}
		var m2 fleetv1.Delta
		encodeDelta(&m2, deltaHeader{}, &d)
		var d2 events.Delta
		if err := decodeDelta(&m2, &d2); err != nil {
			t.Fatalf("re-encoded delta does not decode: %v", err)
		}
		if !sameDelta(&d, &d2) {
			t.Fatalf("re-encode changed the entries or the layout")
		}
	})
}
