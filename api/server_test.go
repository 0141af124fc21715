package api_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// ws is an expected WorkerScore; media alternate name and blocks.
func ws(pod string, rank uint32, blocks uint32, media ...any) *kvindexv1.WorkerScore {
	s := &kvindexv1.WorkerScore{Worker: ref(pod, rank), MatchedBlocks: blocks, MatchedTokens: blocks * blockSize}
	for i := 0; i < len(media); i += 2 {
		n := uint32(media[i+1].(int))
		s.ByMedium = append(s.ByMedium, &kvindexv1.MediumMatch{Medium: media[i].(string), Blocks: n, Tokens: n * blockSize})
	}
	return s
}

func score(t *testing.T, f *fixture, req *kvindexv1.ScoreRequest) *kvindexv1.ScoreResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := f.client.Score(ctx, req)
	if err != nil {
		t.Fatalf("Score(%v): %v", req, err)
	}
	return resp
}

// wantScore compares the core-slice fields of a Score answer (the ranking
// breakdown added later is checked by the ranking tests).
func wantScore(t *testing.T, got *kvindexv1.ScoreResponse, promptBlocks uint32, workers ...*kvindexv1.WorkerScore) {
	t.Helper()
	got = proto.Clone(got).(*kvindexv1.ScoreResponse)
	got.Policy = ""
	for _, w := range got.GetWorkers() {
		w.Overlap, w.Load, w.Penalty, w.Score, w.Reason, w.Health, w.SpeculativeBlocks = 0, nil, 0, 0, "", 0, 0
	}
	want := &kvindexv1.ScoreResponse{BlockSize: blockSize, PromptBlocks: promptBlocks, Workers: workers}
	if !proto.Equal(got, want) {
		t.Errorf("Score response\n got: %s\nwant: %s", protojson.Format(got), protojson.Format(want))
	}
}

// Engine hash bases of the workers in newScoreFixture.
const (
	hashA = 1000
	hashB = 2000
	hashC = 3000
)

// newScoreFixture indexes prompt(1, 8) on three workers of model "m":
// pod-a/0 holds all 8 blocks, pod-b/1 the first 4, pod-c/0 the first 2.
// pod-d/0 holds nothing; pod-m2/0 serves model "m2".
func newScoreFixture(t *testing.T, opts api.Options) (*fixture, map[string]*indexer.Worker) {
	t.Helper()
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	mustModel(t, ix, "m2")
	ws := map[string]*indexer.Worker{
		"a":  mustWorker(t, ix, "m", "pod-a", 0),
		"b":  mustWorker(t, ix, "m", "pod-b", 1),
		"c":  mustWorker(t, ix, "m", "pod-c", 0),
		"d":  mustWorker(t, ix, "m", "pod-d", 0),
		"m2": mustWorker(t, ix, "m2", "pod-m2", 0),
	}
	p := prompt(1, 8)
	apply(t, ws["a"], stored(hashA, p, 0, 3), stored(hashA, p, 3, 8))
	apply(t, ws["b"], stored(hashB, p, 0, 4))
	apply(t, ws["c"], stored(hashC, p, 0, 2))
	// The same tokens under model m2 must never match model m.
	apply(t, ws["m2"], stored(4000, p, 0, 8))
	return serve(t, ix, nil, opts), ws
}

func TestScoreFullAndPartialPrefixes(t *testing.T) {
	f, _ := newScoreFixture(t, api.Options{})
	got := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 8)})
	wantScore(t, got, 8,
		ws("pod-a", 0, 8, "GPU", 8),
		ws("pod-b", 1, 4, "GPU", 4),
		ws("pod-c", 0, 2, "GPU", 2))

	// A trailing partial block is not a block.
	p := append(prompt(1, 8), 1, 2, 3)
	got = score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: p})
	if got.GetPromptBlocks() != 8 || len(got.GetWorkers()) != 3 {
		t.Errorf("prompt with a partial block: got %s", protojson.Format(got))
	}

	// A prompt that diverges in block 3 matches 3 blocks at most.
	p = prompt(1, 8)
	p[3*blockSize+5]++
	got = score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: p})
	wantScore(t, got, 8,
		ws("pod-a", 0, 3, "GPU", 3),
		ws("pod-b", 1, 3, "GPU", 3),
		ws("pod-c", 0, 2, "GPU", 2))

	// A prompt shorter than one block has no blocks and no matches.
	got = score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: []uint32{1, 2, 3}})
	wantScore(t, got, 0)

	// Model m2 sees only its own worker.
	got = score(t, f, &kvindexv1.ScoreRequest{Model: "m2", TokenIds: prompt(1, 8)})
	wantScore(t, got, 8, ws("pod-m2", 0, 8, "GPU", 8))
}

func TestScoreRemovalInTheMiddleShortensPrefix(t *testing.T) {
	f, w := newScoreFixture(t, api.Options{})
	apply(t, w["a"], removed(hashA, 2, 3, events.MediumGPU))
	got := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 8)})
	wantScore(t, got, 8,
		ws("pod-b", 1, 4, "GPU", 4),
		ws("pod-a", 0, 2, "GPU", 2),
		ws("pod-c", 0, 2, "GPU", 2))
}

func TestScoreClearedWorkerIsAbsent(t *testing.T) {
	f, w := newScoreFixture(t, api.Options{})
	apply(t, w["a"], events.Event{Kind: events.KindAllBlocksCleared})
	got := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 8)})
	wantScore(t, got, 8,
		ws("pod-b", 1, 4, "GPU", 4),
		ws("pod-c", 0, 2, "GPU", 2))
}

func TestScoreLoRADoesNotMatchBaseModel(t *testing.T) {
	f, w := newScoreFixture(t, api.Options{})
	// pod-d serves the same tokens under adapter "sql-lora".
	lora := stored(5000, prompt(1, 8), 0, 8)
	lora.LoRAName = "sql-lora"
	apply(t, w["d"], lora)

	got := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 8), LoraName: "sql-lora"})
	wantScore(t, got, 8, ws("pod-d", 0, 8, "GPU", 8))

	got = score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 8)})
	wantScore(t, got, 8,
		ws("pod-a", 0, 8, "GPU", 8),
		ws("pod-b", 1, 4, "GPU", 4),
		ws("pod-c", 0, 2, "GPU", 2))

	got = score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 8), LoraName: "other-lora"})
	wantScore(t, got, 8)
}

func TestScoreCacheSaltDoesNotMatchUnsalted(t *testing.T) {
	f, w := newScoreFixture(t, api.Options{})
	// vLLM puts cache_salt in the first block's extra keys only.
	salted := stored(5000, prompt(1, 8), 0, 8)
	salted.ExtraKeys = make([]events.ExtraKeys, 8)
	salted.ExtraKeys[0] = events.ExtraKeys(events.AppendString(events.AppendTuple(nil, 1), "tenant-7"))
	apply(t, w["d"], salted)

	got := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 8), CacheSalt: "tenant-7"})
	wantScore(t, got, 8, ws("pod-d", 0, 8, "GPU", 8))

	got = score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 8), CacheSalt: "tenant-8"})
	wantScore(t, got, 8)

	got = score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 8)})
	wantScore(t, got, 8,
		ws("pod-a", 0, 8, "GPU", 8),
		ws("pod-b", 1, 4, "GPU", 4),
		ws("pod-c", 0, 2, "GPU", 2))
}

func TestScoreCandidatesAllAppear(t *testing.T) {
	f, _ := newScoreFixture(t, api.Options{})
	got := score(t, f, &kvindexv1.ScoreRequest{
		Model:    "m",
		TokenIds: prompt(1, 8),
		Workers:  []*kvindexv1.WorkerRef{ref("pod-d", 0), ref("pod-b", 1), ref("pod-a", 0), ref("pod-d", 0)},
	})
	wantScore(t, got, 8,
		ws("pod-a", 0, 8, "GPU", 8),
		ws("pod-b", 1, 4, "GPU", 4),
		ws("pod-d", 0, 0))

	// A prompt nobody holds still lists every candidate, sorted by worker.
	got = score(t, f, &kvindexv1.ScoreRequest{
		Model:    "m",
		TokenIds: prompt(9, 2),
		Workers:  []*kvindexv1.WorkerRef{ref("pod-d", 0), ref("pod-c", 0)},
	})
	wantScore(t, got, 2, ws("pod-c", 0, 0), ws("pod-d", 0, 0))
}

func TestScoreBlockKeysEqualsTokenIDs(t *testing.T) {
	f, w := newScoreFixture(t, api.Options{})
	lora := stored(5000, prompt(1, 8), 0, 8)
	lora.LoRAName = "sql-lora"
	apply(t, w["d"], lora)

	for _, extras := range []*indexer.PromptExtras{nil, {LoRAName: "sql-lora"}} {
		keys := indexer.PromptKeys("m", blockSize, prompt(1, 8), extras, nil)
		byKeys := &kvindexv1.ScoreRequest{Model: "m", BlockKeys: make([]uint64, len(keys))}
		for i, k := range keys {
			byKeys.BlockKeys[i] = uint64(k)
		}
		byTokens := &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 8)}
		if extras != nil {
			byTokens.LoraName = extras.LoRAName
		}
		a, b := score(t, f, byKeys), score(t, f, byTokens)
		if !proto.Equal(a, b) {
			t.Errorf("extras %+v: block_keys answer %s differs from token_ids answer %s", extras, protojson.Format(a), protojson.Format(b))
		}
		if len(a.GetWorkers()) == 0 || a.GetWorkers()[0].GetMatchedBlocks() != 8 {
			t.Errorf("extras %+v: want a full match, got %s", extras, protojson.Format(a))
		}
	}
}

func TestScoreByMedium(t *testing.T) {
	f, w := newScoreFixture(t, api.Options{})
	// pod-a offloads blocks 0-5 to CPU (the offload form: no token ids),
	// then evicts blocks 4-7 from GPU.
	apply(t, w["a"],
		events.Event{Kind: events.KindBlockStored, BlockHashes: hashes(hashA, 0, 6), Medium: events.MediumCPU, MediumName: "CPU"},
		removed(hashA, 4, 8, events.MediumGPU))
	got := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 8)})
	wantScore(t, got, 8,
		ws("pod-a", 0, 6, "GPU", 4, "CPU", 6),
		ws("pod-b", 1, 4, "GPU", 4),
		ws("pod-c", 0, 2, "GPU", 2))
}

func TestScoreInvalidArgument(t *testing.T) {
	f, _ := newScoreFixture(t, api.Options{MaxTokens: 8 * blockSize, MaxBlockKeys: 4, MaxCandidates: 2})
	tokens := prompt(1, 2)
	for _, tc := range []struct {
		name string
		req  *kvindexv1.ScoreRequest
		want string // prefix of the status message
	}{
		{"no model", &kvindexv1.ScoreRequest{TokenIds: tokens}, "model: required"},
		{"unknown model", &kvindexv1.ScoreRequest{Model: "x", TokenIds: tokens}, `model: unknown model "x"; known: m, m2`},
		{"both prompts", &kvindexv1.ScoreRequest{Model: "m", TokenIds: tokens, BlockKeys: []uint64{1}}, "token_ids, block_keys, prompt, messages: give exactly one"},
		{"tokens and text", &kvindexv1.ScoreRequest{Model: "m", TokenIds: tokens, Prompt: "hi"}, "token_ids, block_keys, prompt, messages: give exactly one"},
		{"prompt and messages", &kvindexv1.ScoreRequest{Model: "m", Prompt: "hi", Messages: []*kvindexv1.ChatMessage{{Role: "user"}}}, "token_ids, block_keys, prompt, messages: give exactly one"},
		{"no prompt", &kvindexv1.ScoreRequest{Model: "m"}, "token_ids: required (or block_keys, prompt or messages)"},
		{"too many tokens", &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 9)}, "token_ids: 144 tokens exceed the limit of 128"},
		{"too many keys", &kvindexv1.ScoreRequest{Model: "m", BlockKeys: []uint64{1, 2, 3, 4, 5}}, "block_keys: 5 keys exceed the limit of 4"},
		{"too many candidates", &kvindexv1.ScoreRequest{Model: "m", TokenIds: tokens,
			Workers: []*kvindexv1.WorkerRef{ref("pod-a", 0), ref("pod-b", 1), ref("pod-c", 0)}}, "workers: 3 candidates exceed the limit of 2"},
		{"unknown candidate", &kvindexv1.ScoreRequest{Model: "m", TokenIds: tokens,
			Workers: []*kvindexv1.WorkerRef{ref("pod-a", 0), ref("pod-a", 7)}}, `workers[1]: unknown worker pod-a/7 for model "m"`},
		{"candidate of another model", &kvindexv1.ScoreRequest{Model: "m", TokenIds: tokens,
			Workers: []*kvindexv1.WorkerRef{ref("pod-m2", 0)}}, `workers[0]: unknown worker pod-m2/0 for model "m" (it serves "m2")`},
		{"candidate without pod", &kvindexv1.ScoreRequest{Model: "m", TokenIds: tokens,
			Workers: []*kvindexv1.WorkerRef{ref("", 0)}}, "workers[0].pod: required"},
		{"lora with keys", &kvindexv1.ScoreRequest{Model: "m", BlockKeys: []uint64{1}, LoraName: "l"}, "lora_name: not allowed with block_keys"},
		{"salt with keys", &kvindexv1.ScoreRequest{Model: "m", BlockKeys: []uint64{1}, CacheSalt: "s"}, "cache_salt: not allowed with block_keys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.client.Score(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("got %v, want code InvalidArgument", err)
			}
			st, ok := api.ServerStatus(err)
			if !ok || !strings.HasPrefix(st.Message(), tc.want) {
				t.Errorf("server message %q does not start with %q (error %v)", st.Message(), tc.want, err)
			}
		})
	}

	// A failed candidate check leaves no state behind for the next request.
	got := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: tokens})
	wantScore(t, got, 2, ws("pod-a", 0, 2, "GPU", 2), ws("pod-b", 1, 2, "GPU", 2), ws("pod-c", 0, 2, "GPU", 2))
}

// Errors echo what the request sent capped, whatever its size: a 1 MB
// model, pod or policy name comes back as at most a few hundred bytes.
func TestErrorsEchoCappedValues(t *testing.T) {
	f, _ := newScoreFixture(t, api.Options{})
	huge := strings.Repeat("x", 1<<20)
	tokens := prompt(1, 2)
	for _, req := range []*kvindexv1.ScoreRequest{
		{Model: huge, TokenIds: tokens},
		{Model: "m", TokenIds: tokens, Workers: []*kvindexv1.WorkerRef{ref(huge, 0)}},
		{Model: "m", TokenIds: tokens, Loads: []*kvindexv1.WorkerLoad{{Worker: ref(huge, 0)}}},
		{Model: "m", TokenIds: tokens, Policy: &kvindexv1.ScorePolicy{Name: huge}},
	} {
		_, err := f.client.Score(context.Background(), req)
		st, ok := api.ServerStatus(err)
		if !ok || st.Code() != codes.InvalidArgument || len(st.Message()) > 400 || !strings.Contains(st.Message(), "... (104857") {
			t.Fatalf("error of %d bytes: %.200q", len(st.Message()), st.Message())
		}
	}
}

func TestHealthServing(t *testing.T) {
	f, _ := newScoreFixture(t, api.Options{})
	hc := healthpb.NewHealthClient(f.client.Conn())
	for _, svc := range []string{"", "kvindex.v1.IndexService"} {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("health check %q: %v", svc, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q is %v, want SERVING", svc, resp.GetStatus())
		}
	}
}

func TestReflectionListsService(t *testing.T) {
	f, _ := newScoreFixture(t, api.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(f.client.Conn()).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("open reflection stream: %v", err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatalf("send list services: %v", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("receive list services: %v", err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"kvindex.v1.IndexService", "grpc.health.v1.Health"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("reflection lists %v, missing %s", names, want)
		}
	}
	_ = stream.CloseSend()
}

// TestScoreDuringIngest runs Scores while the index changes under them,
// for the race detector and to check that answers stay well-formed.
func TestScoreDuringIngest(t *testing.T) {
	f, w := newScoreFixture(t, api.Options{})
	p := prompt(1, 8)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil && i < 2000; i++ {
			_ = w["d"].ApplyBatch(&events.Batch{Events: []events.Event{stored(9000, p, 0, 8)}})
			_ = w["d"].ApplyBatch(&events.Batch{Events: []events.Event{{Kind: events.KindAllBlocksCleared}}})
		}
	}()
	for i := 0; i < 200; i++ {
		resp := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: p, Workers: []*kvindexv1.WorkerRef{ref("pod-a", 0), ref("pod-d", 0)}})
		if len(resp.GetWorkers()) != 2 || resp.GetWorkers()[0].GetMatchedBlocks() != 8 {
			t.Fatalf("Score during ingest: %s", protojson.Format(resp))
		}
		if d := resp.GetWorkers()[1]; d.GetWorker().GetPod() != "pod-d" || d.GetMatchedBlocks() > 8 {
			t.Fatalf("Score during ingest: %s", protojson.Format(resp))
		}
	}
	cancel()
	wg.Wait()
}
