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

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/daemon"
	"github.com/kvindex/kvindex/internal/netutil"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/picker/envoytest"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/tokenize"
	"github.com/kvindex/kvindex/tokenize/standin"
)

const testModel = "sim/model"

func startServer(t *testing.T) (*Server, string, string) {
	t.Helper()
	return startPod(t, "engine-0")
}

// startPod runs a simulated engine named pod on free ports.
func startPod(t *testing.T, pod string) (*Server, string, string) {
	t.Helper()
	base, err := netutil.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	pub, rep := fmt.Sprintf("tcp://127.0.0.1:%d", base), fmt.Sprintf("tcp://127.0.0.1:%d", base+1)
	s, err := New(Config{Model: testModel, Pod: pod, Publish: pub, Replay: rep, HTTPListen: "127.0.0.1:0",
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
	// kvsim_cached_blocks is what the index holds of the engine once its
	// events are applied (what scripts/image-test.sh checks replicas by).
	var cached float64
	if _, err := fmt.Sscanf(string(body[bytes.Index(body, []byte("\nkvsim_cached_blocks{"))+1:]),
		`kvsim_cached_blocks{engine="0",model_name="sim/model"} %g`, &cached); err != nil || cached < float64(held) {
		t.Fatalf("kvsim_cached_blocks: %v, %g (want at least %d)\n%s", err, cached, held, body)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := c.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{Model: testModel})
		if err != nil {
			t.Fatal(err)
		}
		if ws := resp.GetWorkers(); len(ws) == 1 && float64(ws[0].GetResidentBlocks()) == cached {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("kvindex holds %v of engine-0, the engine caches %g blocks", ws, cached)
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

// TestPickerTokenizesThroughEngines is the gateway path end to end on
// simulated engines: a daemon indexes two engines over ZeroMQ, tokenizes
// through the engines' own render endpoints (their tokenizer_urls), and
// its endpoint picker, asked as Envoy asks (envoytest), sends a chat that
// shares a system prompt with one an engine served to that engine, since
// the ids the engines render are the ids their events carry.
func TestPickerTokenizesThroughEngines(t *testing.T) {
	e0, pub0, rep0 := startPod(t, "engine-0")
	e1, pub1, rep1 := startPod(t, "engine-1")
	urls := []string{"http://" + e0.Addr(), "http://" + e1.Addr()}
	cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "off",
		Models: []config.Model{{Name: testModel, BlockSize: 16, TokenizerURLs: urls}},
		Pods: []config.Pod{{Name: "engine-0", Model: testModel, Endpoint: pub0, ReplayEndpoint: rep0},
			{Name: "engine-1", Model: testModel, Endpoint: pub1, ReplayEndpoint: rep1}},
		Gateway: config.Gateway{Listen: "127.0.0.1:0", Endpoints: []config.Endpoint{
			{Address: e0.Addr(), Pod: "engine-0"}, {Address: e1.Addr(), Pod: "engine-1"}}}}
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
	for _, e := range []*Server{e0, e1} {
		if err := e.pub.WaitForSubscribers(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	system := tokenize.Message{Role: "system", Content: strings.Repeat("Answer in SQL only, with the schema below. ", 60)}
	for i, e := range []*Server{e1, e0} { // each engine serves its own system prompt once
		sys := system
		if i == 1 {
			sys.Content = strings.Repeat("Answer in French, briefly and politely. ", 60)
		}
		if code, out := post(t, "http://"+e.Addr()+"/v1/chat/completions", map[string]any{"model": testModel, "max_tokens": 2,
			"messages": []tokenize.Message{sys, {Role: "user", Content: "warm up"}}}); code != http.StatusOK {
			t.Fatalf("warm-up: %d %v", code, out)
		}
	}
	cc, err := grpc.NewClient(d.GatewayAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := extprocv3.NewExternalProcessorClient(cc)
	body, _ := json.Marshal(map[string]any{"model": testModel, "messages": []tokenize.Message{system, {Role: "user", Content: "top customers?"}}})
	// Once kvindex holds engine-1's blocks of the system prompt, one
	// decision must choose engine-1.
	kv, err := api.Dial(ctx, d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	sysToks := standin.Chat([]tokenize.Message{system}, false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := kv.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: sysToks})
		if err != nil {
			t.Fatal(err)
		}
		if ws := resp.GetWorkers(); len(ws) > 0 && ws[0].GetWorker().GetPod() == "engine-1" && int(ws[0].GetMatchedBlocks()) == len(sysToks)/16 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvindex never held engine-1's system prompt: %v", resp.GetWorkers())
		}
		time.Sleep(10 * time.Millisecond)
	}
	s, err := envoytest.Open(ctx, client, picker.FullDuplex)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := s.Request("/v1/chat/completions", body, 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if first, _, _ := strings.Cut(dec.Header, ","); first != e1.Addr() {
		t.Fatalf("picker chose %q, want engine-1 at %s (it served the system prompt)", dec.Header, e1.Addr())
	}
	if n := e0.Tokenizer().Renders() + e1.Tokenizer().Renders(); n != 1 {
		t.Fatalf("the engines rendered %d prompts, want the picker's one", n)
	}
	if st := d.Picker().Stats(); st.Decisions["routed"] == 0 || st.Decisions["load_only"] != 0 {
		t.Fatalf("picker stats %+v: want routed on the prompt, never by load alone", st)
	}
}
