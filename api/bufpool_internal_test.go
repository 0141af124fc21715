package api

import (
	"slices"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

func TestRequestPoolClasses(t *testing.T) {
	var p requestPool
	// Up to 32 KiB, gRPC's tiers (256 B, 4 KiB, 16 KiB, 32 KiB); above,
	// powers of two to 8 MiB; beyond, the size asked.
	for _, c := range []struct{ n, cap int }{{1, 256}, {32 << 10, 32 << 10}, {32<<10 + 1, 64 << 10}, {95_000, 128 << 10}, {8 << 20, 8 << 20}, {8<<20 + 1, 8<<20 + 1}} {
		b := p.Get(c.n)
		if len(*b) != c.n || cap(*b) != c.cap {
			t.Errorf("Get(%d): len %d cap %d, want %d, %d", c.n, len(*b), cap(*b), c.n, c.cap)
		}
		p.Put(b)
	}
	// A buffer put back may be handed out again, its bytes as they were
	// (sync.Pool may also have dropped it: then a fresh one).
	b := p.Get(100_000)
	(*b)[0] = 7
	p.Put(b)
	if again := p.Get(70_000); len(*again) != 70_000 || cap(*again) != 128<<10 || ((*again)[0] != 7 && (*again)[0] != 0) {
		t.Errorf("Get after Put: len %d cap %d first byte %d", len(*again), cap(*again), (*again)[0])
	}
	// One of a capacity that is not its class's is dropped.
	odd := make([]byte, 100_000)
	p.Put(&odd)
	if got := p.Get(100_000); cap(*got) != 128<<10 {
		t.Errorf("a buffer of an odd capacity was kept: cap %d", cap(*got))
	}
}

// A large request encodes through the codec's pool and decodes from
// several buffers (as gRPC receives it, frame by frame) to the same
// tokens, with the bytes protobuf-go writes.
func TestLargeRequestThroughThePool(t *testing.T) {
	c := NewCodec()
	tokens := make([]uint32, 32768)
	for i := range tokens {
		tokens[i] = uint32(i*7919) % 150_000
	}
	req := &kvindexv1.ScoreRequest{Model: "m", TokenIds: tokens}
	for range 3 { // reused buffers hold the previous request's bytes
		data, err := c.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		b := data.Materialize()
		want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(req)
		if !slices.Equal(b, want) {
			t.Fatalf("encoded %d bytes, not protobuf-go's %d", len(b), len(want))
		}
		data.Free()
		var frames mem.BufferSlice
		for len(b) > 0 {
			n := min(len(b), 16<<10)
			frames = append(frames, mem.SliceBuffer(b[:n]))
			b = b[n:]
		}
		var got kvindexv1.ScoreRequest
		if err := c.Unmarshal(frames, &got); err != nil {
			t.Fatal(err)
		}
		if got.GetModel() != "m" || !slices.Equal(got.GetTokenIds(), tokens) {
			t.Fatalf("decoded model %q, %d tokens; want m, the %d sent", got.GetModel(), len(got.GetTokenIds()), len(tokens))
		}
		tokens[0]++
	}
}
