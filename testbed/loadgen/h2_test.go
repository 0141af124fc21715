package loadgen

import (
	"context"
	"errors"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// h2Shape is a small fleet for H2Conn's tests.
var h2Shape = Shape{Model: "m", BlockSize: 16, Workers: 3, PromptBlocks: 8, SharedBlocks: 2, TailHolders: 1, Prompts: 4}

func startH2Server(t *testing.T) (*Embedded, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	// Bursts of 64 calls must all be served, also under the race detector
	// on a busy machine; admission control has its own tests.
	e, err := StartEmbeddedWith(ctx, h2Shape, "", api.Options{Admission: api.AdmissionOptions{Target: time.Second, MaxQueueDelay: 10 * time.Second, MaxPending: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e, ctx
}

func h2Score(ctx context.Context, c *H2Conn, req *kvindexv1.ScoreRequest) (*kvindexv1.ScoreResponse, error) {
	pb, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	out, err := c.Call(ctx, NewGRPCMessage(pb))
	if err != nil {
		return nil, err
	}
	body, err := GRPCPayload(out)
	if err != nil {
		return nil, err
	}
	var resp kvindexv1.ScoreResponse
	return &resp, proto.Unmarshal(body, &resp)
}

// TestH2ConnAgainstGRPCServer checks the lean client against the real
// gRPC server: answers decoded right, a request split over several DATA
// frames, many calls multiplexed on one connection, and an error status.
func TestH2ConnAgainstGRPCServer(t *testing.T) {
	e, ctx := startH2Server(t)
	c, err := DialH2(ctx, e.Addr, kvindexv1.IndexService_Score_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// The stored tail: prompt 0 is held whole by one worker.
	resp, err := h2Score(ctx, c, &kvindexv1.ScoreRequest{Model: "m", TokenIds: h2Shape.Prompt(0)})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkScore(h2Shape, 0, resp); err != nil {
		t.Fatal(err)
	}

	// 40,000 tokens (~120 KB) span several 16 KiB frames; nothing but the
	// 2-block shared prefix matches after prompt 1's own blocks diverge.
	long := append(append([]uint32(nil), h2Shape.Prompt(1)...), make([]uint32, 40000)...)
	resp, err = h2Score(ctx, c, &kvindexv1.ScoreRequest{Model: "m", TokenIds: long})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkScore(h2Shape, 1, resp); err != nil {
		t.Fatal(err)
	}

	// Concurrent calls share the connection, each with its own answer.
	errs := make(chan error, 64)
	for i := range 64 {
		go func() {
			r, err := h2Score(ctx, c, &kvindexv1.ScoreRequest{Model: "m", TokenIds: h2Shape.Prompt(i % h2Shape.Prompts)})
			if err == nil {
				err = checkScore(h2Shape, int64(i%h2Shape.Prompts), r)
			}
			errs <- err
		}()
	}
	for range 64 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}

	// A request the server refuses: grpc-status 3 (InvalidArgument) with
	// the server's message naming the field.
	_, err = h2Score(ctx, c, &kvindexv1.ScoreRequest{TokenIds: h2Shape.Prompt(0)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "model") {
		t.Fatalf("Score without a model: error %v, want grpc-status 3 naming model", err)
	}
	// The connection is still good after an error status.
	if _, err := h2Score(ctx, c, &kvindexv1.ScoreRequest{Model: "m", TokenIds: h2Shape.Prompt(2)}); err != nil {
		t.Fatal(err)
	}
}

// TestH2ConnServerGone checks that calls fail, and do not hang, when the
// server goes away, and that a cancelled call returns its context's error.
func TestH2ConnServerGone(t *testing.T) {
	e, ctx := startH2Server(t)
	c, err := DialH2(ctx, e.Addr, kvindexv1.IndexService_Score_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := h2Score(cctx, c, &kvindexv1.ScoreRequest{Model: "m", TokenIds: h2Shape.Prompt(0)}); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	e.Close()
	if _, err := h2Score(ctx, c, &kvindexv1.ScoreRequest{Model: "m", TokenIds: h2Shape.Prompt(0)}); err == nil {
		t.Fatal("call after the server stopped succeeded")
	}
	if _, err := DialH2(ctx, e.Addr, "/x"); err == nil {
		t.Fatal("dial to a stopped server succeeded")
	}
}

func TestGRPCPayload(t *testing.T) {
	m := NewGRPCMessage([]byte("abc"))
	if got, err := GRPCPayload(m); err != nil || string(got) != "abc" {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	for _, bad := range [][]byte{nil, {0, 0, 0}, {1, 0, 0, 0, 0}, {0, 0, 0, 0, 5, 'x'}} {
		if _, err := GRPCPayload(bad); err == nil {
			t.Errorf("GRPCPayload(%v) accepted", bad)
		}
	}
}

// TestLongestMatch checks the generator's partial decode of ScoreResponse
// against protobuf-go's full one, and that it rejects truncated input.
func TestLongestMatch(t *testing.T) {
	for _, resp := range []*kvindexv1.ScoreResponse{
		{},
		{BlockSize: 16, PromptBlocks: 9, Policy: "cache_aware"},
		{Workers: []*kvindexv1.WorkerScore{
			{Worker: &kvindexv1.WorkerRef{Pod: "a"}, MatchedBlocks: 7, Score: 0.5, Load: &kvindexv1.LoadDetail{Running: 300}},
			{Worker: &kvindexv1.WorkerRef{Pod: "b", DpRank: 2}, MatchedBlocks: 300, MatchedTokens: 4800, ByMedium: []*kvindexv1.MediumMatch{{Blocks: 5}}},
			{MatchedBlocks: 12},
		}},
	} {
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var want uint32
		for _, w := range resp.GetWorkers() {
			want = max(want, w.GetMatchedBlocks())
		}
		got, err := longestMatch(b)
		if err != nil || got != want {
			t.Errorf("longestMatch(%v) = %d, %v; want %d", resp, got, err, want)
		}
		if len(b) > 0 {
			if _, err := longestMatch(b[:len(b)-1]); err == nil {
				t.Errorf("longestMatch accepted %x, truncated", b[:len(b)-1])
			}
		}
	}
}

// TestH2ConnFlowControl runs H2Conn against a gRPC server with default
// settings: a 64 KiB connection window that the server refills as it
// reads, and bandwidth-delay PINGs that the reader must acknowledge while
// calls wait for window. 48 concurrent calls of ~120 KB each (far over the
// window) must all complete.
func TestH2ConnFlowControl(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ix := indexer.New(indexer.Config{})
	if err := h2Shape.Load(ix); err != nil {
		t.Fatal(err)
	}
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer() // gRPC's defaults, not GRPCOptions
	api.NewServer(ix, nil, api.Options{}).Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()

	c, err := DialH2(ctx, lis.Addr().String(), kvindexv1.IndexService_Score_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	long := append(append([]uint32(nil), h2Shape.Prompt(1)...), make([]uint32, 40000)...)
	errs := make(chan error, 48)
	for range 48 {
		go func() {
			r, err := h2Score(ctx, c, &kvindexv1.ScoreRequest{Model: "m", TokenIds: long})
			if err == nil {
				err = checkScore(h2Shape, 1, r)
			}
			errs <- err
		}()
	}
	for range 48 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestH2ConnWindowWaitEndsWithContext checks that a call waiting for
// connection window returns when its context ends.
func TestH2ConnWindowWaitEndsWithContext(t *testing.T) {
	e, ctx := startH2Server(t)
	c, err := DialH2(ctx, e.Addr, kvindexv1.IndexService_Score_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.mu.Lock()
	c.connWin = -1 << 40 // as if the server had granted nothing
	c.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = c.Call(cctx, NewGRPCMessage([]byte{}))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call without window: %v, want the context's deadline", err)
	}
}
