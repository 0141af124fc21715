package gie_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	k8stypes "k8s.io/apimachinery/pkg/types"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/picker"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/profile"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/clients/gie"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/tokenize"
	"github.com/kvindex/kvindex/tokenize/standin"
)

const (
	model     = "llama"
	blockSize = 4
)

// kvindexServer is a real kvindex gRPC server on 127.0.0.1 over an index
// fed BlockStored events through the indexer's public API.
type kvindexServer struct {
	addr    string
	ix      *indexer.Index
	accepts atomic.Int64  // connections accepted
	hashes  atomic.Uint64 // the last engine block hash stored
	mu      sync.Mutex
	auth    []string // authorization metadata of the calls, in order
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// startKvindex starts the server; with tokenizer it tokenizes text prompts
// through the vLLM stand-in.
func startKvindex(t *testing.T, tokenizer bool) *kvindexServer {
	t.Helper()
	k := &kvindexServer{ix: indexer.New(indexer.Config{})}
	if _, err := k.ix.AddModel(model, blockSize); err != nil {
		t.Fatal(err)
	}
	var opts api.Options
	if tokenizer {
		vllm := httptest.NewServer(&standin.Handler{})
		t.Cleanup(vllm.Close)
		c, err := tokenize.New(tokenize.Options{Endpoints: map[string][]string{model: {vllm.URL}}})
		if err != nil {
			t.Fatal(err)
		}
		opts.Tokenizer = c
	}
	srv := api.NewServer(k.ix, nil, opts)
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		k.mu.Lock()
		k.auth = append(k.auth, strings.Join(md.Get("authorization"), ","))
		k.mu.Unlock()
		return h(ctx, req)
	}
	g := grpc.NewServer(append(srv.GRPCOptions(), grpc.ChainUnaryInterceptor(record))...)
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k.addr = lis.Addr().String()
	go func() { _ = g.Serve(countingListener{lis, &k.accepts}) }()
	t.Cleanup(g.Stop)
	return k
}

// hold makes worker ref hold the first blocks full blocks of tokens.
func (k *kvindexServer) hold(t *testing.T, ref events.WorkerRef, tokens []uint32, blocks int) {
	t.Helper()
	w := k.ix.LookupWorker(ref)
	if w == nil {
		var err error
		if w, err = k.ix.AddWorker(indexer.WorkerInfo{Ref: ref, Model: model}); err != nil {
			t.Fatal(err)
		}
	}
	if blocks == 0 {
		return
	}
	hashes := make([]uint64, blocks)
	for i := range hashes {
		hashes[i] = k.hashes.Add(1)
	}
	err := w.ApplyBatch(&events.Batch{Events: []events.Event{{
		Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: tokens[:blocks*blockSize], BlockSize: blockSize,
	}}})
	if err != nil {
		t.Fatal(err)
	}
}

// endpoint is an endpoint as the EPP makes one from an InferencePool pod:
// named "<pod>-rank-<i>", at ip, port 8000.
func endpoint(pod string, rank int, ip string) fwksched.Endpoint {
	return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{
		NamespacedName: k8stypes.NamespacedName{Namespace: "inference", Name: pod + "-rank-" + strconv.Itoa(rank)},
		PodName:        pod,
		Address:        ip,
		Port:           "8000",
	}, &fwkdl.Metrics{}, nil)
}

// newScheduler is the framework's own scheduler: one profile, the scorer
// and the framework's max-score picker, the single-profile handler.
func newScheduler(s fwksched.Scorer) *scheduling.Scheduler {
	prof := scheduling.NewSchedulerProfile().
		WithScorers(scheduling.NewWeightedScorer(s, 1)).
		WithPicker(picker.NewMaxScorePicker(1))
	cfg := scheduling.NewSchedulerConfig(profile.NewSingleProfileHandler(), map[string]fwksched.SchedulerProfile{"default": prof})
	return scheduling.NewSchedulerWithConfig(cfg)
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(ctrllog.IntoContext(context.Background(), logr.Discard()))
	t.Cleanup(cancel)
	return ctx
}

// picked schedules req over eps and returns the chosen endpoint's name.
func picked(t *testing.T, ctx context.Context, sched *scheduling.Scheduler, req *fwksched.LLMRequest, eps []fwksched.Endpoint) string {
	t.Helper()
	res, err := sched.Schedule(ctx, req, eps)
	if err != nil {
		t.Fatalf("Schedule: %v", err)
	}
	targets := res.ProfileResults[res.PrimaryProfileName].TargetEndpoints
	if len(targets) != 1 {
		t.Fatalf("Schedule picked %d endpoints, want 1", len(targets))
	}
	return targets[0].GetMetadata().NamespacedName.Name
}

// scoresByName is s's scores keyed by endpoint name.
func scoresByName(ctx context.Context, s fwksched.Scorer, req *fwksched.LLMRequest, eps []fwksched.Endpoint) map[string]float64 {
	out := map[string]float64{}
	for ep, v := range s.Score(ctx, fwksched.NewCycleState(), req, eps) {
		out[ep.GetMetadata().NamespacedName.Name] = v
	}
	return out
}

func seq(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func equalScores(t *testing.T, got, want map[string]float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("scores = %v, want %v", got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Fatalf("scores = %v, want %v", got, want)
		}
	}
}

// TestSchedulerPicksPrefixHolder registers the plugin, makes it through the
// framework's registry from its JSON parameters, and has the framework's
// scheduler pick among simulated endpoints: the one whose worker holds the
// longest prefix of the prompt wins, whether the prompt comes as token ids,
// a chat or a completion prompt.
func TestSchedulerPicksPrefixHolder(t *testing.T) {
	k := startKvindex(t, true)
	tokens := seq(4*blockSize+2, 100) // 4 full blocks and a partial one
	chat := []tokenize.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "What is a KV cache?"}}
	chatTokens := standin.Chat(chat, true)
	completion := "Summarise this.\n\nThe quick brown fox jumps over the lazy dog, twice over."
	completionTokens := standin.Tokens(completion, true)
	k.hold(t, events.WorkerRef{Pod: "vllm-a"}, tokens, 1)
	k.hold(t, events.WorkerRef{Pod: "vllm-a"}, chatTokens, len(chatTokens)/blockSize)
	k.hold(t, events.WorkerRef{Pod: "vllm-b"}, nil, 0)
	k.hold(t, events.WorkerRef{Pod: "vllm-b", DPRank: 1}, tokens, 3)
	k.hold(t, events.WorkerRef{Pod: "vllm-b"}, completionTokens, len(completionTokens)/blockSize)

	ctx := testContext(t)
	gie.Register()
	factory, ok := fwkplugin.Registry[gie.Type]
	if !ok {
		t.Fatalf("Register did not register %q", gie.Type)
	}
	params, _ := json.Marshal(map[string]any{"target": k.addr, "model": model, "timeout": "2s"})
	p, err := factory("kvindex-picks", params, fwkplugin.NewEppHandle(ctx, nil))
	if err != nil {
		t.Fatal(err)
	}
	scorer := p.(fwksched.Scorer)
	if tn := scorer.TypedName(); tn.Type != gie.Type || tn.Name != "kvindex-picks" {
		t.Fatalf("TypedName = %+v", tn)
	}
	sched := newScheduler(scorer)
	eps := []fwksched.Endpoint{
		endpoint("vllm-a", 0, "10.0.0.1"),
		endpoint("vllm-b", 0, "10.0.0.2"),
		endpoint("vllm-b", 1, "10.0.0.2"),
		endpoint("vllm-c", 0, "10.0.0.3"), // kvindex knows no vllm-c
	}

	byTokens := &fwksched.LLMRequest{RequestId: "r1", TargetModel: model, TokenizedPrompt: &fwksched.TokenizedPrompt{TokenIDs: tokens}}
	equalScores(t, scoresByName(ctx, scorer, byTokens, eps), map[string]float64{
		"vllm-a-rank-0": 0.25, "vllm-b-rank-0": 0, "vllm-b-rank-1": 0.75, "vllm-c-rank-0": 0,
	})
	for range 5 { // the picker shuffles before sorting: the winner must not depend on it
		if got := picked(t, ctx, sched, byTokens, eps); got != "vllm-b-rank-1" {
			t.Fatalf("token ids: picked %s, want vllm-b-rank-1", got)
		}
	}

	msgs := make([]fwksched.Message, len(chat))
	for i, m := range chat {
		msgs[i] = fwksched.Message{Role: m.Role, Content: fwksched.Content{Raw: m.Content}}
	}
	byChat := &fwksched.LLMRequest{RequestId: "r2", TargetModel: model, Body: &fwksched.LLMRequestBody{ChatCompletions: &fwksched.ChatCompletionsRequest{Messages: msgs}}}
	if got := picked(t, ctx, sched, byChat, eps); got != "vllm-a-rank-0" {
		t.Fatalf("chat: picked %s, want vllm-a-rank-0", got)
	}
	if s := scoresByName(ctx, scorer, byChat, eps)["vllm-a-rank-0"]; s != 1 {
		t.Fatalf("chat: vllm-a scores %v, want 1 (it holds every full block)", s)
	}

	byPrompt := &fwksched.LLMRequest{RequestId: "r3", TargetModel: model, Body: &fwksched.LLMRequestBody{Completions: &fwksched.CompletionsRequest{Prompt: fwksched.Prompt{Raw: completion}}}}
	if got := picked(t, ctx, sched, byPrompt, eps); got != "vllm-b-rank-0" {
		t.Fatalf("completion: picked %s, want vllm-b-rank-0", got)
	}
}

// counter is the value of metric name{outcome} in reg (0 when absent).
func counter(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := outcome == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					match = true
				}
			}
			if match {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestKvindexDown has the scheduler pick while kvindex is not there:
// every endpoint scores 0, the scheduler still picks one, each failure is
// counted, and the outage is logged once.
func TestKvindexDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now

	ctx := testContext(t)
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	s, err := gie.New(ctx, "down", gie.Params{Target: addr, Model: model, Timeout: "2s"},
		gie.Options{Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	eps := []fwksched.Endpoint{endpoint("vllm-a", 0, "10.0.0.1"), endpoint("vllm-b", 0, "10.0.0.2")}
	req := &fwksched.LLMRequest{RequestId: "r1", TargetModel: model, TokenizedPrompt: &fwksched.TokenizedPrompt{TokenIDs: seq(8, 1)}}
	equalScores(t, scoresByName(ctx, s, req, eps), map[string]float64{"vllm-a-rank-0": 0, "vllm-b-rank-0": 0})
	if got := picked(t, ctx, newScheduler(s), req, eps); got != "vllm-a-rank-0" && got != "vllm-b-rank-0" {
		t.Fatalf("picked %s", got)
	}
	if got := counter(t, reg, "kvindex_gie_scores_total", "failed"); got != 2 {
		t.Fatalf("failed = %v, want 2", got)
	}
	if got := counter(t, reg, "kvindex_gie_scores_total", "ok"); got != 0 {
		t.Fatalf("ok = %v, want 0", got)
	}
	if n := strings.Count(logs.String(), "kvindex does not answer"); n != 1 {
		t.Fatalf("outage logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestDeadline: a kvindex that accepts the connection and never answers
// costs the scheduling cycle the timeout, not more.
func TestDeadline(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	conns.Go(func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // read nothing, answer nothing
		}
	})
	t.Cleanup(func() {
		lis.Close()
		conns.Wait()
	})

	ctx := testContext(t)
	reg := prometheus.NewRegistry()
	s, err := gie.New(ctx, "silent", gie.Params{Target: lis.Addr().String(), Model: model, Timeout: "100ms"}, gie.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	eps := []fwksched.Endpoint{endpoint("vllm-a", 0, "10.0.0.1")}
	req := &fwksched.LLMRequest{RequestId: "r1", TargetModel: model, TokenizedPrompt: &fwksched.TokenizedPrompt{TokenIDs: seq(8, 1)}}
	start := time.Now()
	got := scoresByName(ctx, s, req, eps)
	if took := time.Since(start); took < 100*time.Millisecond || took > 5*time.Second {
		t.Fatalf("Score took %v with a 100ms timeout", took)
	}
	equalScores(t, got, map[string]float64{"vllm-a-rank-0": 0})
	if got := counter(t, reg, "kvindex_gie_scores_total", "failed"); got != 1 {
		t.Fatalf("failed = %v, want 1", got)
	}
}

// TestOneConnection: concurrent scheduling cycles share one connection,
// with the token on every call.
func TestOneConnection(t *testing.T) {
	k := startKvindex(t, false)
	tokens := seq(8, 1)
	k.hold(t, events.WorkerRef{Pod: "vllm-a"}, tokens, 2)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	reg := prometheus.NewRegistry()
	s, err := gie.New(ctx, "shared", gie.Params{Target: k.addr, Model: model, Timeout: "5s", TokenFile: tokenFile}, gie.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	eps := []fwksched.Endpoint{endpoint("vllm-a", 0, "10.0.0.1"), endpoint("vllm-b", 0, "10.0.0.2")}
	req := &fwksched.LLMRequest{RequestId: "r1", TargetModel: model, TokenizedPrompt: &fwksched.TokenizedPrompt{TokenIDs: tokens}}
	var wg sync.WaitGroup
	bad := make(chan map[string]float64, 16)
	for range 16 {
		wg.Go(func() {
			if got := scoresByName(ctx, s, req, eps); got["vllm-a-rank-0"] != 1 || got["vllm-b-rank-0"] != 0 {
				bad <- got
			}
		})
	}
	wg.Wait()
	close(bad)
	for got := range bad {
		t.Fatalf("scores = %v, want vllm-a 1, vllm-b 0", got)
	}
	if n := k.accepts.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
	if got := counter(t, reg, "kvindex_gie_scores_total", "ok"); got != 16 {
		t.Fatalf("ok = %v, want 16", got)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, a := range k.auth {
		if a != "Bearer s3cret" {
			t.Fatalf("call %d: authorization %q, want the token file's", i, a)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestEndpointMapping: a listed address names its worker whatever the
// endpoint's name; an endpoint with no address listed and no name maps to
// no worker, scores 0 and is counted; a request without a prompt calls no
// one.
func TestEndpointMapping(t *testing.T) {
	k := startKvindex(t, false)
	tokens := seq(8, 1)
	k.hold(t, events.WorkerRef{Pod: "engine-7", DPRank: 2}, tokens, 1)
	ctx := testContext(t)
	reg := prometheus.NewRegistry()
	s, err := gie.New(ctx, "mapped", gie.Params{Target: k.addr, Model: model, Timeout: "5s",
		Endpoints: []gie.EndpointWorker{{Address: "10.0.0.9:8000", Pod: "engine-7", DPRank: 2}}}, gie.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	listed := endpoint("some-pod", 0, "10.0.0.9")
	nameless := fwksched.NewEndpoint(&fwkdl.EndpointMetadata{Address: "10.0.0.10", Port: "8000"}, &fwkdl.Metrics{}, nil)
	eps := []fwksched.Endpoint{listed, nameless}
	req := &fwksched.LLMRequest{RequestId: "r1", TargetModel: model, TokenizedPrompt: &fwksched.TokenizedPrompt{TokenIDs: tokens}}
	got := s.Score(ctx, fwksched.NewCycleState(), req, eps)
	if got[listed] != 0.5 || got[nameless] != 0 || len(got) != 2 {
		t.Fatalf("scores: listed %v (want 0.5), nameless %v (want 0), %d entries", got[listed], got[nameless], len(got))
	}
	if n := counter(t, reg, "kvindex_gie_unmapped_endpoints_total", ""); n != 1 {
		t.Fatalf("unmapped = %v, want 1", n)
	}

	before := k.accepts.Load()
	empty := &fwksched.LLMRequest{RequestId: "r2", TargetModel: model, Body: &fwksched.LLMRequestBody{Embeddings: &fwksched.EmbeddingsRequest{Input: "x"}}}
	got = s.Score(ctx, fwksched.NewCycleState(), empty, eps)
	if got[listed] != 0 || got[nameless] != 0 {
		t.Fatalf("no prompt: scores %v, want 0", got)
	}
	if n := counter(t, reg, "kvindex_gie_scores_total", "no_prompt"); n != 1 {
		t.Fatalf("no_prompt = %v, want 1", n)
	}
	if k.accepts.Load() != before {
		t.Fatal("a request without a prompt reached kvindex")
	}
}

// TestParams: bad parameters fail the factory, naming the field.
func TestParams(t *testing.T) {
	ctx := testContext(t)
	h := fwkplugin.NewEppHandle(ctx, nil)
	for _, c := range []struct{ params, want string }{
		{`{}`, "target: required"},
		{`{"target":"127.0.0.1:1","timeout":"soon"}`, "timeout:"},
		{`{"target":"127.0.0.1:1","timeout":"-1s"}`, "timeout: -1s is not positive"},
		{`{"target":"127.0.0.1:1","endpoints":[{"address":"10.0.0.1:8000"}]}`, "endpoints[0].pod: required"},
		{`{"target":"127.0.0.1:1","endpoints":[{"pod":"p"}]}`, "endpoints[0].address: required"},
		{`{"target":"127.0.0.1:1","endpoints":[{"address":"a:1","pod":"p"},{"address":"a:1","pod":"q"}]}`, "endpoints[1].address: a:1 is listed twice"},
		{`{"target":"127.0.0.1:1","tokenFile":"/nonexistent/token"}`, "tokenFile:"},
		{`{"target":"127.0.0.1:1","tls":{"caFile":"/nonexistent/ca.pem"}}`, "tls:"},
		{`{"target":"127.0.0.1:1","bogus":1}`, `unknown field "bogus"`},
		{`[1]`, "parameters:"},
	} {
		_, err := gie.Factory("bad", json.RawMessage(c.params), h)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `kvindex-prefix-scorer plugin "bad"`) {
			t.Errorf("%s: err = %v, want one naming the plugin and %q", c.params, err, c.want)
		}
	}
}
