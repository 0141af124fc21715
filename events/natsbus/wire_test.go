package natsbus

import (
	"errors"
	"math/rand/v2"
	"reflect"
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

// Deltas survive encode, marshal, unmarshal and decode unchanged, and a
// chain of stores costs 9 bytes a block.
func TestDeltaRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var m, back fleetv1.Delta
	var got events.Delta
	for i := range 500 {
		d := randomDelta(r, r.IntN(40))
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
		if len(d.Entries) == 0 && len(got.Entries) == 0 {
			continue
		}
		if !reflect.DeepEqual(d.Entries, got.Entries) {
			t.Fatalf("round trip:\n%+v\n%+v", d.Entries, got.Entries)
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
	var m fleetv1.Delta
	if err := unmarshalDelta([]byte{0xff, 0xff}, &m); !errors.Is(err, ErrMalformed) {
		t.Errorf("garbage: %v", err)
	}
}

// FuzzDecodeDelta: no input makes the decoder panic, and what it accepts
// re-encodes to a message that decodes to the same entries.
func FuzzDecodeDelta(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 8 {
		var m fleetv1.Delta
		encodeDelta(&m, deltaHeader{epoch: 1, seq: 1}, randomDelta(r, 10))
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
		if !reflect.DeepEqual(d.Entries, d2.Entries) && (len(d.Entries) > 0 || len(d2.Entries) > 0) {
			t.Fatalf("re-encode changed the entries")
		}
	})
}
