package api

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TestCodecReusesReleasedTokens checks the pool's round trip: a released
// request's token memory is what the next decode fills, and a slice over
// maxPooledTokens is not kept.
func TestCodecReusesReleasedTokens(t *testing.T) {
	if raceOn {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	enc := func(n int) mem.BufferSlice {
		b, err := proto.Marshal(&kvindexv1.ScoreRequest{Model: "m", TokenIds: make([]uint32, n)})
		if err != nil {
			t.Fatal(err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}
	}
	c := NewCodec()
	first := new(kvindexv1.ScoreRequest)
	if err := c.Unmarshal(enc(2048), first); err != nil {
		t.Fatal(err)
	}
	backing := &first.TokenIds[:1][0]
	c.release(first)
	second := new(kvindexv1.ScoreRequest)
	if err := c.Unmarshal(enc(1000), second); err != nil {
		t.Fatal(err)
	}
	if len(second.TokenIds) != 1000 || second.GetModel() != "m" {
		t.Fatalf("decoded %d tokens, model %q", len(second.TokenIds), second.GetModel())
	}
	if &second.TokenIds[0] != backing {
		t.Error("the released token slice was not reused")
	}

	huge := &kvindexv1.ScoreRequest{TokenIds: make([]uint32, 0, maxPooledTokens+1)}
	c.release(huge)
	c.release(second) // now the pool holds second's slice, not huge's
	third := new(kvindexv1.ScoreRequest)
	if err := c.Unmarshal(enc(10), third); err != nil {
		t.Fatal(err)
	}
	if cap(third.TokenIds) > maxPooledTokens {
		t.Errorf("a %d-token slice was pooled", cap(third.TokenIds))
	}
}
