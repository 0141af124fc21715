package api_test

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/tokenize"
	"github.com/kvindex/kvindex/tokenize/standin"
)

// words is a text of n distinct words.
func words(seed, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "w%d-%d ", seed, i)
	}
	return b.String()
}

// textFixture serves model m, with pod-a holding the blocks of text's
// stand-in tokens and of chat's, and a tokenizer asking a stand-in
// /tokenize server over HTTP.
func textFixture(t *testing.T, text string, chat []tokenize.Message) (*fixture, *standin.Handler) {
	t.Helper()
	h := &standin.Handler{}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	tk, err := tokenize.New(tokenize.Options{Endpoints: map[string][]string{"m": {hs.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	mustModel(t, ix, "m2")
	a := mustWorker(t, ix, "m", "pod-a", 0)
	mustWorker(t, ix, "m", "pod-b", 0)
	toks := standin.Tokens(text, true)
	apply(t, a, stored(1000, toks, 0, len(toks)/blockSize))
	ct := standin.Chat(chat, true)
	apply(t, a, stored(5000, ct, 0, len(ct)/blockSize))
	return serve(t, ix, nil, api.Options{Tokenizer: tk}), h
}

// TestScoreText: a prompt and a chat given as text match exactly as their
// token ids do, over gRPC, and the second ask is answered from the cache.
func TestScoreText(t *testing.T) {
	text := words(1, 100)
	chat := []tokenize.Message{{Role: "system", Content: words(2, 40)}, {Role: "user", Content: words(3, 30)}}
	f, h := textFixture(t, text, chat)
	ctx := context.Background()
	for range 2 {
		resp, err := f.client.Score(ctx, &kvindexv1.ScoreRequest{Model: "m", Prompt: text})
		if err != nil {
			t.Fatal(err)
		}
		want := len(standin.Tokens(text, true)) / blockSize
		if resp.GetPromptBlocks() != uint32(want) || len(resp.GetWorkers()) != 1 || resp.GetWorkers()[0].GetMatchedBlocks() != uint32(want) {
			t.Fatalf("prompt: %v, want pod-a with all %d blocks", resp, want)
		}
	}
	msgs := make([]*kvindexv1.ChatMessage, len(chat))
	for i, m := range chat {
		msgs[i] = &kvindexv1.ChatMessage{Role: m.Role, Content: m.Content}
	}
	rr, err := f.client.Route(ctx, &kvindexv1.RouteRequest{RequestId: "r1", Score: &kvindexv1.ScoreRequest{Model: "m", Messages: msgs}})
	if err != nil {
		t.Fatal(err)
	}
	want := len(standin.Chat(chat, true)) / blockSize
	if rr.GetChosen().GetPod() != "pod-a" || rr.GetRanking().GetWorkers()[0].GetMatchedBlocks() != uint32(want) {
		t.Fatalf("chat route: %v, want pod-a with %d blocks", rr, want)
	}
	if h.Requests() != 2 {
		t.Fatalf("tokenizer asked %d times, want 2 (the repeated prompt is cached)", h.Requests())
	}
}

// TestScoreTextErrors: each failure of a text prompt has its code and
// names what failed.
func TestScoreTextErrors(t *testing.T) {
	f, _ := textFixture(t, words(1, 20), nil)
	ctx := context.Background()
	check := func(name string, req *kvindexv1.ScoreRequest, code codes.Code, want string) {
		t.Helper()
		_, err := f.client.Score(ctx, req)
		if status.Code(err) != code || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %v containing %q", name, err, code, want)
		}
	}
	check("model without tokenizer", &kvindexv1.ScoreRequest{Model: "m2", Prompt: "hi"}, codes.FailedPrecondition, `no tokenizer configured for model "m2"`)
	check("message without role", &kvindexv1.ScoreRequest{Model: "m", Messages: []*kvindexv1.ChatMessage{{Content: "x"}}}, codes.InvalidArgument, "messages[0].role: required")

	// A server without a tokenizer refuses text.
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	bare := serve(t, ix, nil, api.Options{})
	if _, err := bare.client.Score(ctx, &kvindexv1.ScoreRequest{Model: "m", Prompt: "hi"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("no tokenizer: %v", err)
	}

	// No endpoint answering: UNAVAILABLE naming it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	tk, err := tokenize.New(tokenize.Options{Endpoints: map[string][]string{"m": {dead}}})
	if err != nil {
		t.Fatal(err)
	}
	down := serve(t, ix, nil, api.Options{Tokenizer: tk})
	_, err = down.client.Score(ctx, &kvindexv1.ScoreRequest{Model: "m", Prompt: "hi"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), dead+tokenize.RenderCompletionPath) {
		t.Errorf("dead tokenizer: %v, want Unavailable naming %s", err, dead)
	}
}

// TestLookupAndDiagnoseText: Lookup and Diagnose take a prompt as text or
// as a chat as Score does, tokenized through the model's server, and
// answer as they do for its token ids; the parity check uses those ids.
func TestLookupAndDiagnoseText(t *testing.T) {
	text := words(4, 100)
	chat := []tokenize.Message{{Role: "user", Content: words(5, 60)}}
	f, _ := textFixture(t, text, chat)
	ctx := context.Background()
	toks := standin.Tokens(text, true)
	byText, err := f.client.Lookup(ctx, &kvindexv1.LookupRequest{Model: "m", Prompt: text})
	if err != nil {
		t.Fatal(err)
	}
	byIDs, err := f.client.Lookup(ctx, &kvindexv1.LookupRequest{Model: "m", TokenIds: toks})
	if err != nil {
		t.Fatal(err)
	}
	want := uint32(len(toks) / blockSize)
	if !proto.Equal(byText, byIDs) || byText.GetPromptBlocks() != want || byText.GetIndexedBlocks() != want {
		t.Fatalf("lookup by text %v, by ids %v, want %d blocks indexed", byText, byIDs, want)
	}
	d, err := f.client.Diagnose(ctx, &kvindexv1.DiagnoseRequest{Model: "m", Messages: []*kvindexv1.ChatMessage{{Role: "user", Content: chat[0].Content}},
		Worker: &kvindexv1.WorkerRef{Pod: "pod-b"}})
	if err != nil {
		t.Fatal(err)
	}
	if d.GetMatchedBlocks() != 0 || d.GetPromptBlocks() != uint32(len(standin.Chat(chat, true))/blockSize) || len(d.GetFindings()) == 0 {
		t.Fatalf("diagnose of pod-b (holds nothing) by chat: %v", d)
	}
	// The parity check needs token ids, which a text prompt now gives.
	if _, err := f.client.Diagnose(ctx, &kvindexv1.DiagnoseRequest{Model: "m", Prompt: text, Worker: &kvindexv1.WorkerRef{Pod: "pod-a"}, EngineBlockHashes: []uint64{1000}}); err != nil {
		t.Fatalf("parity check with a text prompt: %v", err)
	}
	if _, err := f.client.Lookup(ctx, &kvindexv1.LookupRequest{Model: "m", Prompt: text, TokenIds: toks}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("prompt and token_ids together: %v, want InvalidArgument", err)
	}
}
