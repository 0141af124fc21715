package api_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // the codec BenchmarkCodecMarshal compares with
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// tokenSample has token ids of every varint length from 1 to 5 bytes,
// including the 32-bit extremes.
var tokenSample = []uint32{0, 1, 127, 128, 300, 16383, 16384, 151_643, 2_097_151, 2_097_152, 1 << 28, math.MaxUint32}

// rawTokens encodes token ids as unpacked varint fields.
func rawTokens(ids ...uint64) []byte {
	var b []byte
	for _, id := range ids {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, id)
	}
	return b
}

// packedTokens encodes token ids as one packed field.
func packedTokens(ids ...uint64) []byte {
	var v []byte
	for _, id := range ids {
		v = protowire.AppendVarint(v, id)
	}
	b := protowire.AppendTag(nil, 2, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return b
}

// TestUnmarshalScoreRequest decodes requests in every shape a protobuf
// encoder may send and compares with protobuf-go's result field by field.
func TestUnmarshalScoreRequest(t *testing.T) {
	full := &kvindexv1.ScoreRequest{
		Model:     "llama",
		TokenIds:  tokenSample,
		BlockKeys: []uint64{1, math.MaxUint64},
		LoraName:  "adapter",
		CacheSalt: "salt",
		Workers:   []*kvindexv1.WorkerRef{{Pod: "pod-1", DpRank: 3}},
		Explain:   true,
	}
	model := mustMarshal(t, &kvindexv1.ScoreRequest{Model: "m"})
	lora := mustMarshal(t, &kvindexv1.ScoreRequest{LoraName: "l"})
	cases := []struct {
		name string
		in   []byte
		want []uint32 // token ids; the other fields are checked against protobuf-go
	}{
		{"protobuf-go encoding of every field", mustMarshal(t, full), tokenSample},
		{"no tokens", model, nil},
		{"empty message", nil, nil},
		{"unpacked", rawTokens(5, 600, 70000), []uint32{5, 600, 70000}},
		{"packed then unpacked then packed", slices.Concat(packedTokens(1, 2), rawTokens(3), packedTokens(4)), []uint32{1, 2, 3, 4}},
		{"fields around and between token runs", slices.Concat(model, packedTokens(9, 8), lora, packedTokens(7), model), []uint32{9, 8, 7}},
		{"ids wider than 32 bits are truncated", packedTokens(1<<32|5, math.MaxUint64), []uint32{5, math.MaxUint32}},
		{"empty packed run", packedTokens(), nil},
		// protobuf-go keeps a field of the wrong wire type as unknown.
		{"token_ids as fixed32", protowire.AppendFixed32(protowire.AppendTag(nil, 2, protowire.Fixed32Type), 7), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got, want kvindexv1.ScoreRequest
			if err := api.UnmarshalScoreRequest(tc.in, &got); err != nil {
				t.Fatalf("UnmarshalScoreRequest: %v", err)
			}
			if err := proto.Unmarshal(tc.in, &want); err != nil {
				t.Fatalf("proto.Unmarshal: %v", err)
			}
			if !slices.Equal(got.GetTokenIds(), tc.want) {
				t.Errorf("token ids %v, want %v", got.GetTokenIds(), tc.want)
			}
			if !proto.Equal(&got, &want) {
				t.Errorf("decoded %v, protobuf-go decoded %v", &got, &want)
			}
		})
	}
}

// TestUnmarshalScoreRequestAppends checks merge semantics: ids are
// appended to what the request holds, into its capacity.
func TestUnmarshalScoreRequestAppends(t *testing.T) {
	backing := make([]uint32, 1, 64)
	backing[0] = 42
	req := &kvindexv1.ScoreRequest{TokenIds: backing}
	if err := api.UnmarshalScoreRequest(packedTokens(1, 2, 3), req); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(req.GetTokenIds(), []uint32{42, 1, 2, 3}) {
		t.Fatalf("token ids %v, want [42 1 2 3]", req.GetTokenIds())
	}
	if &req.TokenIds[0] != &backing[0] {
		t.Error("decoding reallocated a slice with room to spare")
	}
}

// TestUnmarshalScoreRequestErrors checks that malformed input is rejected
// with an error that says what was wrong, as protobuf-go rejects it.
func TestUnmarshalScoreRequestErrors(t *testing.T) {
	good := packedTokens(300, 70000)
	cases := []struct {
		name, in, want string
	}{
		{"truncated packed run", string(good[:len(good)-1]), "token_ids"},
		{"varint cut inside the run", string(protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), []byte{0x80, 0x80})), "token_ids"},
		{"unpacked id cut short", string(protowire.AppendTag(nil, 2, protowire.VarintType)) + "\x80", "token_ids"},
		{"bad tag", "\x80", "ScoreRequest"},
		{"field 0", "\x00\x01", "ScoreRequest"},
		{"model cut short", "\x0a\x05ab", "field 1"},
		{"model not UTF-8", "\x0a\x02\xff\xfe", "ScoreRequest"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var req kvindexv1.ScoreRequest
			err := api.UnmarshalScoreRequest([]byte(tc.in), &req)
			if err == nil {
				t.Fatalf("accepted %q", tc.in)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
			if proto.Unmarshal([]byte(tc.in), new(kvindexv1.ScoreRequest)) == nil {
				t.Errorf("protobuf-go accepts %q, the codec does not", tc.in)
			}
		})
	}
}

// FuzzUnmarshalScoreRequest checks the hand-written decoder against
// protobuf-go on arbitrary input: the same verdict and, when both accept,
// the same message. It must never panic.
func FuzzUnmarshalScoreRequest(f *testing.F) {
	f.Add(mustMarshal(f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: tokenSample, LoraName: "l"}))
	f.Add(slices.Concat(packedTokens(1, 1<<40), rawTokens(3, math.MaxUint64)))
	f.Add(mustMarshal(f, &kvindexv1.ScoreRequest{Workers: []*kvindexv1.WorkerRef{{Pod: "p"}}, BlockKeys: []uint64{1, 2}}))
	f.Add([]byte{0x12, 0x03, 0x80, 0x80, 0x01})
	f.Fuzz(func(t *testing.T, in []byte) {
		var got, want kvindexv1.ScoreRequest
		gerr := api.UnmarshalScoreRequest(in, &got)
		werr := proto.Unmarshal(in, &want)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("codec error %v, protobuf-go error %v on %x", gerr, werr, in)
		}
		if gerr == nil && !proto.Equal(&got, &want) {
			t.Fatalf("codec decoded %v, protobuf-go %v from %x", &got, &want, in)
		}
	})
}

// marshalCodec encodes m with kvindex's Codec and returns the bytes.
func marshalCodec(t testing.TB, m any) ([]byte, error) {
	t.Helper()
	data, err := api.NewCodec().Marshal(m)
	if err != nil {
		return nil, err
	}
	defer data.Free()
	return data.Materialize(), nil
}

// TestMarshalScoreRequest checks that the codec encodes ScoreRequests in
// every shape byte for byte as protobuf-go does, below and above gRPC's
// buffer pooling threshold, and rejects what protobuf-go rejects.
func TestMarshalScoreRequest(t *testing.T) {
	withUnknown := &kvindexv1.ScoreRequest{Model: "m", TokenIds: []uint32{1, 2}}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7))
	cases := []struct {
		name string
		req  *kvindexv1.ScoreRequest
	}{
		{"empty", &kvindexv1.ScoreRequest{}},
		{"model only", &kvindexv1.ScoreRequest{Model: "llama"}},
		{"every varint length", &kvindexv1.ScoreRequest{Model: "m", TokenIds: tokenSample}},
		{"a prompt above the pooling threshold", &kvindexv1.ScoreRequest{Model: "bench", TokenIds: realisticTokens(2048)}},
		{"a long prompt (2-byte length prefix and more)", &kvindexv1.ScoreRequest{Model: "m", TokenIds: realisticTokens(40_000)}},
		{"block keys", &kvindexv1.ScoreRequest{Model: "m", BlockKeys: []uint64{0, 1, 1 << 40, math.MaxUint64}}},
		{"every field", &kvindexv1.ScoreRequest{
			Model:     "llama",
			TokenIds:  tokenSample,
			BlockKeys: []uint64{1, math.MaxUint64},
			LoraName:  "adapter",
			CacheSalt: "salt",
			Workers:   []*kvindexv1.WorkerRef{{Pod: "pod-1", DpRank: 3}, {Pod: "pod-2"}, nil},
			BlockExtraKeys: []*kvindexv1.ExtraKeys{{Values: []*kvindexv1.ExtraValue{
				{Kind: &kvindexv1.ExtraValue_Str{Str: "img"}}, {Kind: &kvindexv1.ExtraValue_Int{Int: -3}},
			}}, {}},
			Loads:   []*kvindexv1.WorkerLoad{{Worker: ref("pod-1", 0), Running: 2, Waiting: 1, KvCacheUsage: 0.5, QueuedPrefillTokens: 900}},
			Policy:  &kvindexv1.ScorePolicy{Name: "cache_aware", GpuWeight: 1, LoadWeight: math.Copysign(0, -1)},
			Explain: true,
		}},
		{"unknown fields", withUnknown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := marshalCodec(t, tc.req)
			if err != nil {
				t.Fatalf("codec: %v", err)
			}
			want := mustMarshal(t, tc.req)
			if !slices.Equal(got, want) {
				t.Fatalf("codec wrote %d bytes %x\nprotobuf-go %d bytes %x", len(got), got[:min(len(got), 64)], len(want), want[:min(len(want), 64)])
			}
		})
	}
	for _, bad := range []*kvindexv1.ScoreRequest{
		{Model: "\xff", TokenIds: tokenSample},
		{Model: "m", LoraName: "\xfe"},
		{Model: "m", CacheSalt: "\xc0"},
		{Model: "m", TokenIds: realisticTokens(2048), Workers: []*kvindexv1.WorkerRef{{Pod: "\xff"}}},
	} {
		if _, err := marshalCodec(t, bad); err == nil {
			t.Errorf("codec encoded %v, which protobuf-go rejects", bad)
		} else if _, perr := proto.Marshal(bad); perr == nil {
			t.Errorf("protobuf-go accepts %v, the codec does not: %v", bad, err)
		}
	}
}

// FuzzMarshalScoreRequest checks the hand-written encoder against
// protobuf-go on every ScoreRequest that protobuf-go decodes from
// arbitrary input: the same verdict and the same bytes.
func FuzzMarshalScoreRequest(f *testing.F) {
	f.Add(mustMarshal(f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: tokenSample, LoraName: "l", Explain: true}))
	f.Add(mustMarshal(f, &kvindexv1.ScoreRequest{Workers: []*kvindexv1.WorkerRef{{Pod: "p"}}, BlockKeys: []uint64{1, 2}, Policy: &kvindexv1.ScorePolicy{Name: "x"}}))
	f.Add(slices.Concat(packedTokens(1, 1<<40), rawTokens(3, math.MaxUint64)))
	f.Add([]byte{0x0a, 0x01, 0xff}) // a model that is not UTF-8: protobuf-go decodes and re-encodes nothing
	f.Fuzz(func(t *testing.T, in []byte) {
		var req kvindexv1.ScoreRequest
		if proto.Unmarshal(in, &req) != nil {
			return
		}
		got, gerr := marshalCodec(t, &req)
		want, werr := proto.Marshal(&req)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("codec error %v, protobuf-go error %v on %v", gerr, werr, &req)
		}
		if gerr == nil && !slices.Equal(got, want) {
			t.Fatalf("codec wrote %x, protobuf-go %x for %v", got, want, &req)
		}
	})
}

// unmarshalCodec decodes b with kvindex's Codec, as a client does.
func unmarshalCodec(b []byte, m any) error {
	return api.NewCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m)
}

// sampleResponse has every ScoreResponse field set, with a string of
// every kind, several media per worker and a worker with none.
func sampleResponse() *kvindexv1.ScoreResponse {
	return &kvindexv1.ScoreResponse{
		BlockSize: 16, PromptBlocks: 128, Policy: "cache_aware",
		Workers: []*kvindexv1.WorkerScore{
			{
				Worker: ref("pod-1", 2), MatchedBlocks: 128, MatchedTokens: 2048,
				ByMedium: []*kvindexv1.MediumMatch{{Medium: "GPU", Blocks: 100, Tokens: 1600}, {Medium: "CPU", Blocks: 128, Tokens: 2048}},
				Health:   kvindexv1.WorkerHealth_WORKER_HEALTH_OK, SpeculativeBlocks: 3, Overlap: 0.75,
				Load: &kvindexv1.LoadDetail{Running: 4, Waiting: 1, KvCacheUsage: 0.5, InflightRequests: 2,
					InflightPrefillTokens: 1 << 40, QueuedPrefillTokens: 900, Source: "scrape"},
				Penalty: 12.5, Score: -1234.5, Reason: "longest match, ünïcode",
			},
			{Worker: ref("pod-2", 0), Load: &kvindexv1.LoadDetail{Source: "none"}, Health: -1, Score: math.Copysign(0, -1)},
			{},
		},
	}
}

// TestUnmarshalScoreResponse decodes what the server writes, real replies
// and every field, and odd encodings that protobuf-go accepts, and
// compares with protobuf-go's result.
func TestUnmarshalScoreResponse(t *testing.T) {
	ix, p := newFleet(t)
	s := api.NewServer(ix, nil, api.Options{})
	var real [][]byte
	for _, req := range []*kvindexv1.ScoreRequest{
		{Model: "m", TokenIds: p},
		{Model: "m", TokenIds: p, Explain: true},
		{Model: "m", TokenIds: p, Workers: []*kvindexv1.WorkerRef{ref("pod-1", 0), ref("pod-7", 0)}},
		{Model: "m", TokenIds: p, Policy: &kvindexv1.ScorePolicy{Name: "cache_aware", LoadWeight: 1},
			Loads: []*kvindexv1.WorkerLoad{{Worker: ref("pod-3", 0), Running: 5, KvCacheUsage: 0.9}}},
		{Model: "m", TokenIds: prompt(9, 4)}, // no match: no workers
	} {
		resp, err := s.Score(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		real = append(real, mustMarshal(t, resp))
	}
	sample := mustMarshal(t, sampleResponse())
	worker := mustMarshal(t, &kvindexv1.ScoreResponse{Workers: []*kvindexv1.WorkerScore{{Worker: ref("a", 1)}}})
	split := mustMarshal(t, &kvindexv1.ScoreResponse{Workers: []*kvindexv1.WorkerScore{{Worker: ref("", 7)}}})
	cases := map[string][]byte{
		"every field":                 sample,
		"empty":                       nil,
		"fields repeated (last wins)": slices.Concat(sample, mustMarshal(t, &kvindexv1.ScoreResponse{BlockSize: 32, Policy: "x"})),
		"two replies back to back":    slices.Concat(worker, split),
		"unknown field":               slices.Concat(sample, protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1)),
		"known field, other type":     slices.Concat(protowire.AppendFixed32(protowire.AppendTag(nil, 1, protowire.Fixed32Type), 7), sample),
	}
	// One WorkerScore whose worker field comes twice: protobuf-go merges.
	ws := mustMarshal(t, &kvindexv1.WorkerScore{Worker: ref("a", 0), MatchedBlocks: 3})
	ws = slices.Concat(ws, mustMarshal(t, &kvindexv1.WorkerScore{Worker: &kvindexv1.WorkerRef{DpRank: 4}}))
	cases["a sub-message in two parts (merged)"] = protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), ws)
	for i, b := range real {
		cases[fmt.Sprintf("server reply %d", i)] = b
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			var got, want kvindexv1.ScoreResponse
			if err := unmarshalCodec(in, &got); err != nil {
				t.Fatalf("codec: %v", err)
			}
			if err := proto.Unmarshal(in, &want); err != nil {
				t.Fatalf("protobuf-go: %v", err)
			}
			if !proto.Equal(&got, &want) {
				t.Errorf("codec decoded %v\nprotobuf-go    %v", &got, &want)
			}
		})
	}
	// Decoding into a message that holds something replaces it, as
	// proto.Unmarshal does.
	got := sampleResponse()
	if err := unmarshalCodec(real[0], got); err != nil {
		t.Fatal(err)
	}
	var want kvindexv1.ScoreResponse
	if err := proto.Unmarshal(real[0], &want); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, &want) {
		t.Errorf("decoding over a used message: %v, want %v", got, &want)
	}
}

// TestUnmarshalScoreResponseErrors checks that the codec rejects what
// protobuf-go rejects.
func TestUnmarshalScoreResponseErrors(t *testing.T) {
	good := mustMarshal(t, sampleResponse())
	for name, in := range map[string][]byte{
		"truncated":           good[:len(good)-1],
		"policy not UTF-8":    slices.Concat(good, []byte{0x22, 0x01, 0xff}),
		"pod not UTF-8":       {0x1a, 0x05, 0x0a, 0x03, 0x0a, 0x01, 0xff},
		"bad tag":             {0x80},
		"varint too long":     {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"worker cut short":    {0x1a, 0x05, 0x10},
		"end group unmatched": {0x0c},
	} {
		t.Run(name, func(t *testing.T) {
			var got kvindexv1.ScoreResponse
			cerr := unmarshalCodec(in, &got)
			perr := proto.Unmarshal(in, new(kvindexv1.ScoreResponse))
			if cerr == nil || perr == nil {
				t.Errorf("codec error %v, protobuf-go error %v: want both to reject %x", cerr, perr, in)
			}
		})
	}
}

// FuzzUnmarshalScoreResponse checks the client's reply decoder against
// protobuf-go on arbitrary input: the same verdict and, when both accept,
// equal messages that re-encode to the same bytes (which also compares
// NaN payloads and -0).
func FuzzUnmarshalScoreResponse(f *testing.F) {
	f.Add(mustMarshal(f, sampleResponse()))
	f.Add(mustMarshal(f, &kvindexv1.ScoreResponse{Workers: []*kvindexv1.WorkerScore{{Worker: ref("p", 1), Overlap: math.NaN()}}}))
	f.Add([]byte{0x1a, 0x02, 0x0a, 0x00, 0x1a, 0x00})
	f.Fuzz(func(t *testing.T, in []byte) {
		var got, want kvindexv1.ScoreResponse
		gerr := unmarshalCodec(in, &got)
		werr := proto.Unmarshal(in, &want)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("codec error %v, protobuf-go error %v on %x", gerr, werr, in)
		}
		if gerr != nil {
			return
		}
		opts := proto.MarshalOptions{Deterministic: true}
		gb, err1 := opts.Marshal(&got)
		wb, err2 := opts.Marshal(&want)
		if err1 != nil || err2 != nil || !slices.Equal(gb, wb) {
			t.Fatalf("codec decoded %v, protobuf-go %v from %x", &got, &want, in)
		}
	})
}

// TestCodecPoolsTokensOverGRPC sends concurrent Scores for different
// prompts through a server whose codec reuses token memory: every answer
// must be the one for its own prompt, so no call ever sees another's
// tokens (run under -race too).
func TestCodecPoolsTokensOverGRPC(t *testing.T) {
	ix, _ := newFleet(t)
	f := serve(t, ix, nil, api.Options{})
	const callers, calls = 8, 60
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				n := 1 + (c*calls+i)%benchBlocks // a prefix of 1..128 blocks
				p := fleetPrompt[:n*blockSize]
				resp, err := f.client.Score(context.Background(), &kvindexv1.ScoreRequest{Model: "m", TokenIds: p})
				if err != nil {
					errs <- err
					return
				}
				for _, w := range resp.GetWorkers() {
					if want := min(uint32(n), fleetHeld(w.GetWorker().GetPod())); w.GetMatchedBlocks() != want {
						errs <- fmt.Errorf("prompt of %d blocks: %s matched %d, want %d", n, w.GetWorker().GetPod(), w.GetMatchedBlocks(), want)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// fleetPrompt is newFleet's 128-block prompt.
var fleetPrompt = prompt(1, benchBlocks)

// newFleet is the benchmark fleet: pod-i holds the first 16*(i+1) blocks
// of fleetPrompt.
func newFleet(tb testing.TB) (*indexer.Index, []uint32) {
	tb.Helper()
	ix := indexer.New(indexer.Config{})
	mustModel(tb, ix, "m")
	for i := range benchWorkers {
		w := mustWorker(tb, ix, "m", fmt.Sprintf("pod-%d", i), 0)
		apply(tb, w, stored(uint64(i)<<32, fleetPrompt, 0, int(fleetHeld(fmt.Sprintf("pod-%d", i)))))
	}
	return ix, fleetPrompt
}

// fleetHeld is how many blocks of fleetPrompt pod holds in newFleet.
func fleetHeld(pod string) uint32 {
	var i int
	fmt.Sscanf(pod, "pod-%d", &i)
	return uint32(benchBlocks * (i + 1) / benchWorkers)
}

// BenchmarkCodec compares decoding a 2,048-token ScoreRequest with
// protobuf-go and with the hand path (into a reused slice, as the server
// does with its pool).
func BenchmarkCodec(b *testing.B) {
	in := mustMarshal(b, &kvindexv1.ScoreRequest{Model: "bench", TokenIds: realisticTokens(2048)})
	b.Run("protobuf-go", func(b *testing.B) {
		b.SetBytes(int64(len(in)))
		b.ReportAllocs()
		for b.Loop() {
			var req kvindexv1.ScoreRequest
			if err := proto.Unmarshal(in, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kvindex", func(b *testing.B) {
		c := api.NewCodec()
		data := mem.BufferSlice{mem.SliceBuffer(in)}
		var tokens []uint32
		b.SetBytes(int64(len(in)))
		b.ReportAllocs()
		for b.Loop() {
			req := kvindexv1.ScoreRequest{TokenIds: tokens[:0]}
			if err := c.Unmarshal(data, &req); err != nil {
				b.Fatal(err)
			}
			tokens = req.TokenIds
		}
	})
}

// BenchmarkCodecMarshal compares encoding a 2,048- and a 32,768-token
// ScoreRequest with gRPC's protobuf codec and with the hand path (each
// into its codec's buffer pool, returned after each call as gRPC does once
// it has written the bytes).
func BenchmarkCodecMarshal(b *testing.B) {
	for _, n := range []int{2048, 32768} {
		req := &kvindexv1.ScoreRequest{Model: "bench", TokenIds: realisticTokens(n)}
		for _, c := range []struct {
			name  string
			codec encoding.CodecV2
		}{{"protobuf-go", encoding.GetCodecV2("proto")}, {"kvindex", api.NewCodec()}} {
			b.Run(fmt.Sprintf("tokens=%d/%s", n, c.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					data, err := c.codec.Marshal(req)
					if err != nil {
						b.Fatal(err)
					}
					data.Free()
				}
			})
		}
	}
}

// BenchmarkCodecUnmarshalResponse compares decoding an 8-worker
// ScoreResponse, as the server writes it, with protobuf-go and with the
// hand path.
func BenchmarkCodecUnmarshalResponse(b *testing.B) {
	ix, p := newFleet(b)
	resp, err := api.NewServer(ix, nil, api.Options{}).Score(context.Background(), &kvindexv1.ScoreRequest{Model: "m", TokenIds: p})
	if err != nil {
		b.Fatal(err)
	}
	data := mem.BufferSlice{mem.SliceBuffer(mustMarshal(b, resp))}
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"protobuf-go", encoding.GetCodecV2("proto")}, {"kvindex", api.NewCodec()}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var r kvindexv1.ScoreResponse
				if err := c.codec.Unmarshal(data, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// realisticTokens returns n ids spread over a 152 K vocabulary (Qwen's
// size), mostly 3-byte varints, as real prompts are.
func realisticTokens(n int) []uint32 {
	t := make([]uint32, n)
	x := uint32(2463534242)
	for i := range t {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		t[i] = x % 151_936
	}
	return t
}
