package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/internal/config"
	"github.com/kvindex/kvindex/internal/daemon"
	"github.com/kvindex/kvindex/internal/netutil"
	"github.com/kvindex/kvindex/internal/sim/engine"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/tokenize/standin"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

const testModel = "sim/model"

func startServer(t *testing.T) (*Server, string, string) {
	t.Helper()
	base, err := netutil.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	pub, rep := fmt.Sprintf("tcp://127.0.0.1:%d", base), fmt.Sprintf("tcp://127.0.0.1:%d", base+1)
	s, err := New(Config{Model: testModel, Pod: "engine-0", Publish: pub, Replay: rep, HTTPListen: "127.0.0.1:0",
		Engine: engine.Config{CacheBlocks: 2000}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return s, pub, rep
}

// postRaw posts body as JSON and returns the answer's status and bytes.
func postRaw(t *testing.T, url string, body any) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

func post(t *testing.T, url string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

func cachedTokens(out map[string]any) int {
	u := out["usage"].(map[string]any)
	return int(u["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64))
}

// TestServesAndPublishes: a real kvindex daemon subscribed to the
// simulated engine's ZeroMQ sockets learns the blocks the engine cached
// serving OpenAI requests (the ids its render and /tokenize endpoints
// answer, standin.Chat's, are the ones the events carry); a second
// request sharing
// the system prompt hits the engine's cache; /metrics says so under
// vLLM's names.
func TestServesAndPublishes(t *testing.T) {
	s, pub, rep := startServer(t)
	cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "off",
		Models: []config.Model{{Name: testModel, BlockSize: 16}},
		Pods:   []config.Pod{{Name: "engine-0", Model: testModel, Endpoint: pub, ReplayEndpoint: rep}}}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ddone := make(chan error, 1)
	go func() { ddone <- d.Run(ctx) }()
	defer func() { cancel(); <-ddone }()
	if err := s.pub.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}

	system := tokenize.Message{Role: "system", Content: strings.Repeat("You are a careful assistant for the kvindex demo. ", 40)}
	first := []tokenize.Message{system, {Role: "user", Content: "first question"}}
	url := "http://" + s.Addr()
	code, out := post(t, url+"/v1/chat/completions", map[string]any{"model": testModel, "max_tokens": 4, "messages": first})
	if code != http.StatusOK || cachedTokens(out) != 0 {
		t.Fatalf("first request: %d %v", code, out)
	}
	promptTokens := int(out["usage"].(map[string]any)["prompt_tokens"].(float64))
	if want := len(standin.Chat(first, true)); promptTokens != want {
		t.Fatalf("prompt_tokens %d, want %d (the stand-in's)", promptTokens, want)
	}
	code, out = post(t, url+"/v1/chat/completions", map[string]any{"model": testModel, "max_tokens": 4,
		"messages": []tokenize.Message{system, {Role: "user", Content: "second question"}}})
	// Shared with the first: BOS, the system message, the user header.
	sysBlocks := (len(standin.Chat([]tokenize.Message{system}, false)) + 1) / 16
	if code != http.StatusOK || cachedTokens(out) != sysBlocks*16 {
		t.Fatalf("second request: %d, cached %v, want %d", code, out["usage"], sysBlocks*16)
	}
	if msg := out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any); msg["role"] != "assistant" {
		t.Fatalf("choice: %v", msg)
	}

	// kvindex holds the first prompt's blocks on engine-0.
	c, err := api.Dial(ctx, d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The engine's render endpoint answers the ids its events carried:
	// the first prompt's every full block is held.
	var rendered tokenize.WireRender
	if code, raw := postRaw(t, url+tokenize.RenderChatPath, map[string]any{"model": testModel, "messages": first}); code != http.StatusOK || json.Unmarshal(raw, &rendered) != nil || !slices.Equal(rendered.TokenIDs, standin.Chat(first, true)) {
		t.Fatalf("render: %d %s", code, raw)
	}
	var tokenized tokenize.WireResponse
	if code, raw := postRaw(t, url+tokenize.TokenizePath, map[string]any{"model": testModel, "messages": first}); code != http.StatusOK || json.Unmarshal(raw, &tokenized) != nil || !slices.Equal(tokenized.Tokens, rendered.TokenIDs) {
		t.Fatalf("/tokenize: %d %s", code, raw)
	}
	toks := rendered.TokenIDs
	held := len(toks) / 16
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := c.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: toks})
		if err != nil {
			t.Fatal(err)
		}
		if ws := resp.GetWorkers(); len(ws) == 1 && ws[0].GetWorker().GetPod() == "engine-0" && int(ws[0].GetMatchedBlocks()) == held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvindex never matched the first prompt's %d blocks: %v", held, resp.GetWorkers())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A completion prompt's paragraphs are its pieces, after BOS.
	code, out = post(t, url+"/v1/completions", map[string]any{"model": testModel, "prompt": "alpha beta\n\ngamma", "max_tokens": 2})
	if code != http.StatusOK || out["object"] != "text_completion" || int(out["usage"].(map[string]any)["prompt_tokens"].(float64)) != 1+3+2 {
		t.Fatalf("completion: %d %v", code, out)
	}

	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		fmt.Sprintf(`vllm:prefix_cache_hits_total{engine="0",model_name="%s"} %d`, testModel, sysBlocks*16),
		fmt.Sprintf(`vllm:request_success_total{engine="0",model_name="%s"} 3`, testModel),
		`vllm:num_requests_running{engine="0",model_name="sim/model"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="sim/model"} 0`,
		`vllm:prefix_cache_queries_total`, `vllm:num_requests_waiting`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s\n%s", want, body)
		}
	}
}

// TestRefusals: the errors vLLM's API gives, with its error body.
func TestRefusals(t *testing.T) {
	s, _, _ := startServer(t)
	url := "http://" + s.Addr()
	for _, tc := range []struct {
		path string
		body map[string]any
		code int
		text string
	}{
		{"/v1/completions", map[string]any{"model": "other", "prompt": "x"}, 404, "does not exist"},
		{"/v1/completions", map[string]any{"model": testModel}, 400, "prompt must be"},
		{"/v1/completions", map[string]any{"model": testModel, "prompt": "x", "stream": true}, 400, "stream"},
		{"/v1/completions", map[string]any{"model": testModel, "prompt": "x", "max_tokens": 5000}, 400, "max_tokens"},
		{"/v1/chat/completions", map[string]any{"model": testModel}, 400, "messages"},
		{"/v1/completions", map[string]any{"model": testModel, "prompt": strings.Repeat("y", 4*16*2000)}, 400, "exceed the KV cache"},
	} {
		code, out := post(t, url+tc.path, tc.body)
		msg, _ := out["error"].(map[string]any)["message"].(string)
		if code != tc.code || !strings.Contains(msg, tc.text) {
			t.Errorf("%s %v: %d %q, want %d with %q", tc.path, tc.body, code, msg, tc.code, tc.text)
		}
	}
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || m["data"].([]any)[0].(map[string]any)["id"] != testModel {
		t.Fatalf("/v1/models: %v %v", m, err)
	}
}
