package natsbus

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

// randomChunk returns a chunk of n random segments and a random header.
func randomChunk(r *rand.Rand, n int) (chunkHeader, [][]byte) {
	h := chunkHeader{epoch: r.Uint64(), seq: r.Uint64N(1 << uint(r.IntN(64))), blocks: r.Uint64N(1 << 40), index: r.Uint32N(10), last: r.IntN(2) == 0}
	if r.IntN(4) == 0 {
		h.err = "snapshot failed: épuisé"
	}
	segs := make([][]byte, n)
	for i := range segs {
		segs[i] = make([]byte, r.IntN(300))
		for j := range segs[i] {
			segs[i][j] = byte(r.Uint32())
		}
	}
	return h, segs
}

// sameChunk reports whether the generated message m says what h and segs
// do.
func sameChunk(m *fleetv1.SnapshotChunk, h chunkHeader, segs [][]byte) bool {
	if m.GetEpoch() != h.epoch || m.GetSeq() != h.seq || m.GetIndex() != h.index || m.GetLast() != h.last ||
		m.GetError() != h.err || m.GetBlocks() != h.blocks || len(m.GetSegments()) != len(segs) {
		return false
	}
	for i, s := range m.GetSegments() {
		if !bytes.Equal(s, segs[i]) {
			return false
		}
	}
	return true
}

// TestChunkMatchesGenerated checks the hand-written chunk encoding against
// the generated code both ways: what the agent sends unmarshals with
// proto.Unmarshal to the same fields, and what proto.Marshal writes
// unmarshalChunk reads back, segments aliasing the message.
func TestChunkMatchesGenerated(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		h, segs := randomChunk(r, r.IntN(5))
		var b []byte
		for _, s := range segs {
			b = appendChunkSegment(b, s)
		}
		b = appendChunkHeader(b, h)
		var m fleetv1.SnapshotChunk
		if err := proto.Unmarshal(b, &m); err != nil {
			t.Fatalf("chunk %d: proto.Unmarshal of the hand-written chunk: %v", i, err)
		}
		if !sameChunk(&m, h, segs) {
			t.Fatalf("chunk %d: generated code reads %v, want %+v", i, &m, h)
		}
		gen, err := proto.Marshal(&m)
		if err != nil {
			t.Fatal(err)
		}
		var c snapshotChunk
		if err := unmarshalChunk(gen, &c); err != nil {
			t.Fatalf("chunk %d: unmarshalChunk of proto.Marshal's: %v", i, err)
		}
		if c.chunkHeader != h || len(c.segments) != len(segs) {
			t.Fatalf("chunk %d: read %+v with %d segments, want %+v with %d", i, c.chunkHeader, len(c.segments), h, len(segs))
		}
		for j, s := range c.segments {
			if !bytes.Equal(s, segs[j]) {
				t.Fatalf("chunk %d segment %d differs", i, j)
			}
			if len(s) > 0 && !aliases(gen, s) {
				t.Fatalf("chunk %d segment %d is a copy, not a slice of the message", i, j)
			}
		}
	}
}

// aliases reports whether s lies inside b.
func aliases(b, s []byte) bool {
	if len(s) == 0 || len(b) == 0 {
		return false
	}
	for i := range b {
		if &b[i] == &s[0] {
			return i+len(s) <= len(b)
		}
	}
	return false
}

// TestUnmarshalChunkSkipsUnknownFields: fields of other numbers, and known
// numbers of another wire type, are skipped as the generated code skips
// them; truncated input is ErrMalformed.
func TestUnmarshalChunkSkipsUnknownFields(t *testing.T) {
	b := appendChunkSegment(nil, []byte("seg"))
	b = protowire.AppendTag(b, 99, protowire.VarintType)
	b = protowire.AppendVarint(b, 7)
	b = protowire.AppendTag(b, chunkSeq, protowire.BytesType) // seq with the wrong wire type
	b = protowire.AppendBytes(b, []byte("x"))
	b = protowire.AppendTag(b, 100, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, 1)
	b = appendChunkHeader(b, chunkHeader{epoch: 5, last: true})
	var c snapshotChunk
	if err := unmarshalChunk(b, &c); err != nil {
		t.Fatal(err)
	}
	var m fleetv1.SnapshotChunk
	if err := proto.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if c.epoch != 5 || c.seq != m.GetSeq() || !c.last || len(c.segments) != 1 || string(c.segments[0]) != "seg" {
		t.Fatalf("read %+v, generated code %v", c, &m)
	}
	for n := 1; n < len(b); n++ {
		if err := unmarshalChunk(b[:n], &c); err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("truncated at %d: %v, want ErrMalformed", n, err)
		}
	}
	if err := unmarshalChunk(b[:2], &c); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated segment: %v, want ErrMalformed", err)
	}
}

// FuzzUnmarshalChunk: no input makes unmarshalChunk panic, and every
// input the generated code accepts it reads to the same fields.
func FuzzUnmarshalChunk(f *testing.F) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 8 {
		h, segs := randomChunk(r, 3)
		var b []byte
		for _, s := range segs {
			b = appendChunkSegment(b, s)
		}
		f.Add(appendChunkHeader(b, h))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var c snapshotChunk
		err := unmarshalChunk(b, &c)
		var m fleetv1.SnapshotChunk
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		if err != nil {
			t.Fatalf("the generated code reads the chunk, unmarshalChunk fails: %v", err)
		}
		if !sameChunk(&m, c.chunkHeader, c.segments) {
			t.Fatalf("read %+v, generated code %v", c.chunkHeader, &m)
		}
	})
}
