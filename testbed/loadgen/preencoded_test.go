package loadgen

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// recordingServer answers Score with answer (or refuses every call with
// refuse) and keeps the requests it decoded.
type recordingServer struct {
	kvindexv1.UnimplementedIndexServiceServer
	answer *kvindexv1.ScoreResponse
	refuse bool

	mu   sync.Mutex
	reqs []*kvindexv1.ScoreRequest
}

func (s *recordingServer) Score(_ context.Context, req *kvindexv1.ScoreRequest) (*kvindexv1.ScoreResponse, error) {
	s.mu.Lock()
	s.reqs = append(s.reqs, proto.Clone(req).(*kvindexv1.ScoreRequest))
	s.mu.Unlock()
	if s.refuse {
		return nil, status.Error(codes.ResourceExhausted, "overloaded")
	}
	return s.answer, nil
}

// startRecording serves s over real gRPC on a loopback port (grpc-go's own
// protobuf codec: an independent decoder of what the client sent) and
// returns a client of it.
func startRecording(t *testing.T, s *recordingServer) *api.Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	kvindexv1.RegisterIndexServiceServer(g, s)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	c, err := api.Dial(context.Background(), lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestPreencodedScoreDoSendsEachPrompt: over real gRPC, call k of the
// pre-encoded Do delivers prompt k mod Prompts, exactly the message the
// marshalling Do sends (token ids or, with keys, block keys), its reply is decoded and
// checked (a longest match other than the shape's is an error naming it),
// and a refusal keeps its ResourceExhausted code.
func TestPreencodedScoreDoSendsEachPrompt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shape := Shape{Model: "m", BlockSize: 16, Workers: 4, PromptBlocks: 40, SharedBlocks: 8, TailHolders: 1, Prompts: 3}
	good := &kvindexv1.ScoreResponse{BlockSize: 16, PromptBlocks: 40, Workers: []*kvindexv1.WorkerScore{
		{Worker: &kvindexv1.WorkerRef{Pod: "a"}, MatchedBlocks: 8},
		{Worker: &kvindexv1.WorkerRef{Pod: "b"}, MatchedBlocks: 40, MatchedTokens: 640},
	}}
	for _, keys := range []bool{false, true} {
		srv := &recordingServer{answer: good}
		c := startRecording(t, srv)
		do, err := ScoreDo(shape, []*api.Client{c}, keys, true, true)
		if err != nil {
			t.Fatal(err)
		}
		for k := range int64(7) {
			if err := do(ctx, 0, k); err != nil {
				t.Fatalf("keys %v: call %d: %v", keys, k, err)
			}
		}
		want := scoreMessages(shape, keys)
		if len(srv.reqs) != 7 {
			t.Fatalf("keys %v: the server decoded %d requests, want 7", keys, len(srv.reqs))
		}
		for k, got := range srv.reqs {
			if !proto.Equal(got, want[k%3]) {
				t.Errorf("keys %v: call %d delivered %d token ids and %d block keys, want prompt %d's %d and %d",
					keys, k, len(got.GetTokenIds()), len(got.GetBlockKeys()), k%3, len(want[k%3].GetTokenIds()), len(want[k%3].GetBlockKeys()))
			}
		}
	}

	short := proto.Clone(good).(*kvindexv1.ScoreResponse)
	short.Workers[1].MatchedBlocks = 39
	c := startRecording(t, &recordingServer{answer: short})
	do, err := ScoreDo(shape, []*api.Client{c}, false, true, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := do(ctx, 0, 4); err == nil || !strings.Contains(err.Error(), "prompt 1: longest match 39 blocks, the shape stored 40") {
		t.Errorf("a reply matching 39 of 40 blocks: %v, want the check's error", err)
	}
	unchecked, err := ScoreDo(shape, []*api.Client{c}, false, false, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := unchecked(ctx, 0, 4); err != nil {
		t.Errorf("the same reply unchecked: %v", err)
	}

	c = startRecording(t, &recordingServer{refuse: true})
	do, err = ScoreDo(shape, []*api.Client{c}, false, true, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := do(ctx, 0, 0); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "prompt 0") {
		t.Errorf("a refused call: %v, want ResourceExhausted naming prompt 0", err)
	}
}

// TestPreencodedCodec: the codec writes a pre-encoded request's bytes as
// they are, refuses anything else with an error naming the type, and
// decodes replies.
func TestPreencodedCodec(t *testing.T) {
	cc := preencodedCodec{replies: api.NewCodec()}
	if _, err := cc.Marshal(&kvindexv1.ScoreRequest{Model: "m"}); err == nil || !strings.Contains(err.Error(), "*kvindexv1.ScoreRequest") {
		t.Errorf("encoded a ScoreRequest message: %v", err)
	}
	req := encoded{1, 2, 3}
	b, err := cc.Marshal(req)
	if err != nil || b.Len() != 3 || string(b.Materialize()) != string(req) {
		t.Fatalf("encoded %v (%v), want the 3 bytes as given", b.Materialize(), err)
	}
	want := &kvindexv1.ScoreResponse{PromptBlocks: 5, Workers: []*kvindexv1.WorkerScore{{MatchedBlocks: 5}}}
	wire, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got kvindexv1.ScoreResponse
	if err := cc.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &got); err != nil || !proto.Equal(&got, want) {
		t.Fatalf("decoded %v (%v), want %v", &got, err, want)
	}
}
