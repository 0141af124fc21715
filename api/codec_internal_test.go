package api

import (
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
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

// TestUnmarshalScoreResponseFastPath checks that a reply in the server's
// form takes the hand path, in 7 allocations for 8 workers, and that what
// it must leave to protobuf-go is left to it.
func TestUnmarshalScoreResponseFastPath(t *testing.T) {
	resp := &kvindexv1.ScoreResponse{BlockSize: 16, PromptBlocks: 128, Policy: "cache_aware"}
	for i := range 8 {
		resp.Workers = append(resp.Workers, &kvindexv1.WorkerScore{
			Worker:        &kvindexv1.WorkerRef{Pod: fmt.Sprintf("pod-%d", i)},
			MatchedBlocks: 128, MatchedTokens: 2048, Health: kvindexv1.WorkerHealth_WORKER_HEALTH_OK,
			ByMedium: []*kvindexv1.MediumMatch{{Medium: "GPU", Blocks: 128, Tokens: 2048}},
			Overlap:  1, Score: -100, Load: &kvindexv1.LoadDetail{Source: "none"},
		})
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var got kvindexv1.ScoreResponse
	if !unmarshalScoreResponse(b, &got) {
		t.Fatal("a reply in the server's form was left to protobuf-go")
	}
	if !proto.Equal(&got, resp) {
		t.Fatalf("decoded %v, want %v", &got, resp)
	}
	if !raceOn {
		r := new(kvindexv1.ScoreResponse) // as gRPC's generated client allocates it
		allocs := testing.AllocsPerRun(100, func() { unmarshalScoreResponse(b, r) })
		if allocs > 7 {
			t.Errorf("decoding 8 workers allocates %.0f times, want <= 7", allocs)
		}
	}
	unknown := protowire.AppendVarint(protowire.AppendTag(slices.Clone(b), 99, protowire.VarintType), 1)
	ws, err := proto.Marshal(&kvindexv1.WorkerScore{Worker: &kvindexv1.WorkerRef{Pod: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	twice := protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), slices.Concat(ws, ws))
	for name, in := range map[string][]byte{"unknown field": unknown, "worker field twice": twice, "truncated": b[:len(b)-1]} {
		if unmarshalScoreResponse(in, &got) {
			t.Errorf("%s: taken by the hand path", name)
		}
	}
}
