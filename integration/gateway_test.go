package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/picker/envoytest"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/tokenize"
	"github.com/kvindex/kvindex/tokenize/standin"
)

// The gateway tests run the daemon with its endpoint picker, fed by
// simulated engines over ZeroMQ, tokenizing through the stand-in /tokenize
// server over HTTP. Envoy itself cannot run here: envoytest replays the
// exact message sequence Envoy's ext_proc filter sends (request headers,
// request body chunks, response headers, response body chunks, end of
// stream, or a reset), over real gRPC on TCP.

// gateway is a fleet with the picker on, and an ext_proc client of it.
type gateway struct {
	*fleet
	tok    *standin.Handler
	client extprocv3.ExternalProcessorClient
	addrs  map[string]string // pod -> the address the gateway knows it by
	mode   picker.BodyMode
	engine map[string]*engine // per pod (rank 0), for chained hashes
}

func startGateway(t *testing.T, mode picker.BodyMode, cold bool, pods ...string) *gateway {
	return startGatewayWith(t, mode, cold, nil, pods...)
}

// startGatewayWith is startGateway with more configuration.
func startGatewayWith(t *testing.T, mode picker.BodyMode, cold bool, configure func(*config.Config), pods ...string) *gateway {
	t.Helper()
	g := &gateway{tok: &standin.Handler{}, addrs: map[string]string{}, mode: mode, engine: map[string]*engine{}}
	ts := httptest.NewServer(g.tok)
	t.Cleanup(ts.Close)
	var specs []podSpec
	for i, p := range pods {
		specs = append(specs, podSpec{name: p})
		g.addrs[p] = fmt.Sprintf("10.1.0.%d:8000", i+1)
		g.engine[p] = &engine{}
	}
	bodyMode := config.BodyModeFullDuplex
	if mode == picker.Buffered {
		bodyMode = config.BodyModeBuffered
	}
	f := newFleet(t, fleetOptions{configure: func(c *config.Config) {
		c.Models[0].TokenizerURLs = []string{ts.URL}
		c.Gateway = config.Gateway{Listen: "127.0.0.1:0", BodyMode: bodyMode, Fallbacks: 1}
		for _, p := range pods {
			c.Gateway.Endpoints = append(c.Gateway.Endpoints, config.Endpoint{Address: g.addrs[p], Pod: p})
		}
		if cold {
			// A pool member kvindex hears nothing from: routable, cold.
			c.Gateway.Endpoints = append(c.Gateway.Endpoints, config.Endpoint{Address: "10.1.0.99:8000", Pod: "cold", Model: model})
		}
		if configure != nil {
			configure(c)
		}
	}}, specs...)
	if cold {
		g.addrs["cold"] = "10.1.0.99:8000"
	}
	f.start()
	g.fleet = f
	cc, err := grpc.NewClient(f.d.GatewayAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	g.client = extprocv3.NewExternalProcessorClient(cc)
	return g
}

// pod returns the pod behind a destination's first endpoint.
func (g *gateway) pod(dest string) string {
	first, _, _ := strings.Cut(dest, ",")
	for p, a := range g.addrs {
		if a == first {
			return p
		}
	}
	return first
}

// request replays one chat request through the picker and returns the
// pod chosen; the stream is left open for the response.
func (g *gateway) request(msgs []tokenize.Message) (*envoytest.Stream, string) {
	g.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "stream": true})
	s, err := envoytest.Open(context.Background(), g.client, g.mode)
	if err != nil {
		g.t.Fatal(err)
	}
	d, err := s.Request("/v1/chat/completions", body, 512, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	if d.Status != 0 {
		g.t.Fatalf("picker answered %d", d.Status)
	}
	return s, g.pod(d.Header)
}

// finish replays a response to a request in flight with inflight others:
// it stays in flight until the first body chunk, and not after.
func (g *gateway) finish(s *envoytest.Stream, pod string, inflight int) {
	g.t.Helper()
	if err := s.ResponseHeaders(200, false); err != nil {
		g.t.Fatal(err)
	}
	if n := g.d.InFlight(); n != inflight {
		g.t.Fatalf("%s: in flight before the first chunk: %d, want %d", pod, n, inflight)
	}
	if err := s.ResponseChunk([]byte("data: {}\n\n"), false); err != nil {
		g.t.Fatal(err)
	}
	if n := g.d.InFlight(); n != inflight-1 {
		g.t.Fatalf("%s: in flight after the first chunk: %d, want %d", pod, n, inflight-1)
	}
	respond(g.t, s, 2)
}

// respond replays the rest of a streamed response, n chunks and the end
// of stream.
func respond(t *testing.T, s *envoytest.Stream, n int) {
	t.Helper()
	for i := range n {
		if err := s.ResponseChunk([]byte(fmt.Sprintf("data: {\"i\":%d}\n\n", i)), i == n-1); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// cache has pod's engine announce the prompt's blocks, as vLLM does after
// the prefill, and waits until the daemon applied them.
func (g *gateway) cache(pod string, toks []uint32) {
	g.t.Helper()
	ev, _ := g.engine[pod].store(0, toks)
	g.publish(pod, 0, ev)
}

// routeChoice is what Score ranks first for the chat among the pool's
// workers, every worker ranked as Route ranks them.
func (g *gateway) routeChoice(msgs []tokenize.Message) string {
	g.t.Helper()
	req := &kvindexv1.ScoreRequest{Model: model, Policy: &kvindexv1.ScorePolicy{}}
	for _, m := range msgs {
		req.Messages = append(req.Messages, &kvindexv1.ChatMessage{Role: m.Role, Content: m.Content})
	}
	for p := range g.addrs {
		req.Workers = append(req.Workers, &kvindexv1.WorkerRef{Pod: p})
	}
	return g.score(req).GetWorkers()[0].GetWorker().GetPod()
}

func sentence(seed, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "c%d-w%d ", seed, i)
	}
	return b.String()
}

// TestGatewayConversations: several multi-turn conversations, in both
// body modes. Each pick equals Route's own choice (Score's first worker
// just before), the request is in flight from the pick until the first
// response chunk and not after, and every later turn of a conversation
// lands on the engine that cached its history.
func TestGatewayConversations(t *testing.T) {
	for _, mode := range []picker.BodyMode{picker.FullDuplex, picker.Buffered} {
		t.Run(fmt.Sprint("mode", mode), func(t *testing.T) {
			g := startGateway(t, mode, false, "e1", "e2", "e3")
			type conv struct {
				msgs []tokenize.Message
				home string
			}
			convs := make([]*conv, 6)
			for i := range convs {
				convs[i] = &conv{msgs: []tokenize.Message{{Role: "system", Content: sentence(100+i, 40)}, {Role: "user", Content: sentence(200+i, 30)}}}
			}
			homes := map[string]int{}
			for turn := range 3 {
				// The first turns arrive together: each is in flight while
				// the next is picked, so their load spreads them. Later
				// turns come one at a time.
				streams := make([]*envoytest.Stream, len(convs))
				for i, c := range convs {
					if turn == 0 && i > 0 {
						// Routes a millisecond apart make kvindex's arrival
						// rate a thousand a second, where joining a queued
						// request's step costs its successors less than an
						// idle engine's own step, and the rate decays between
						// the Score below and the Route it is compared with,
						// so a near tie flips. 50 ms apart both see one rate.
						time.Sleep(50 * time.Millisecond)
					}
					want := g.routeChoice(c.msgs)
					s, got := g.request(c.msgs)
					if got != want {
						t.Fatalf("turn %d conversation %d: picked %s, Route's choice %s", turn, i, got, want)
					}
					if turn == 0 {
						c.home = got
						homes[got]++
					} else if got != c.home {
						t.Fatalf("turn %d conversation %d: picked %s, its history is on %s", turn, i, got, c.home)
					}
					streams[i] = s
					if turn > 0 {
						g.finish(s, c.home, 1)
					} else if n := g.d.InFlight(); n != i+1 {
						t.Fatalf("in flight after %d picks: %d", i+1, n)
					}
				}
				for i, c := range convs {
					if turn == 0 {
						g.finish(streams[i], c.home, len(convs)-i)
					}
					// The engine caches the prompt and the answer.
					c.msgs = append(c.msgs, tokenize.Message{Role: "assistant", Content: sentence(300+10*i+turn, 20)})
					g.cache(c.home, standin.Chat(c.msgs, false))
					c.msgs = append(c.msgs, tokenize.Message{Role: "user", Content: sentence(400+10*i+turn, 15)})
				}
			}
			if len(homes) < 2 {
				t.Fatalf("every conversation went to one engine: %v (load is not spread)", homes)
			}
			st := g.d.Picker().Stats()
			if st.Decisions["routed"] != 18 || st.Releases["first_chunk"] != 18 || st.Active != 0 {
				t.Fatalf("picker stats %+v", st)
			}
		})
	}
}

// TestGatewayCancelAndErrors: 10,000 requests through the picker, 16 at a
// time, ending every way a request ends at a gateway: a full response, a
// reset before the body is complete, a reset after the pick and before
// any response, a reset mid-response, an upstream error status, a
// response without a body. After them the in-flight table is empty and
// every routed request was released once, for its reason.
func TestGatewayCancelAndErrors(t *testing.T) {
	const n, workers = 10000, 16
	g := startGateway(t, picker.FullDuplex, true, "e1", "e2", "e3")
	prompts := make([][]byte, 40)
	for i := range prompts {
		prompts[i], _ = json.Marshal(map[string]any{"model": model, "messages": []tokenize.Message{{Role: "user", Content: sentence(500+i, 64)}}})
	}
	var next sync.Mutex
	issued := 0
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	counts := make([]map[string]int, workers)
	for w := range workers {
		counts[w] = map[string]int{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				next.Lock()
				if issued == n {
					next.Unlock()
					return
				}
				issued++
				next.Unlock()
				kind, pod, err := oneRequest(g, rng, prompts[rng.IntN(len(prompts))])
				if err != nil {
					errs <- err
					return
				}
				counts[w][kind]++
				counts[w]["on "+pod]++
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := map[string]int{}
	for _, c := range counts {
		for k, v := range c {
			total[k] += v
		}
	}
	g.waitFor(func() bool { return g.d.Picker().Active() == 0 }, "the picker's streams to end")
	if inflight := g.d.InFlight(); inflight != 0 {
		t.Fatalf("after %d requests %v: %d still in flight", n, total, inflight)
	}
	st := g.d.Picker().Stats()
	released := int64(0)
	for _, v := range st.Releases {
		released += v
	}
	routed := st.Decisions["routed"] + st.Decisions["load_only"]
	if released != routed || st.ReleaseFailures != 0 {
		t.Fatalf("routed %d, released %d (%v), failures %d", routed, released, st.Releases, st.ReleaseFailures)
	}
	if int64(total["reset_before_body"]) != int64(n)-routed {
		t.Fatalf("requests %v, picker routed %d", total, routed)
	}
	// A reset mid-response comes after the first chunk released it.
	if st.Releases["stream_closed"] != int64(total["reset_after_pick"]) || st.Releases["first_chunk"] != int64(total["full"]+total["reset_mid_response"]) ||
		st.Releases["error_status"] != int64(total["upstream_error"]) || st.Releases["end_of_stream"] != int64(total["no_body"]) {
		t.Fatalf("releases %v for requests %v", st.Releases, total)
	}
	if total["on cold"] == 0 || total["on e1"] == 0 {
		t.Errorf("destinations %v: the cold endpoint and the engines should all be chosen", total)
	}
	metrics := g.metrics()
	for _, want := range []string{`kvindex_gateway_releases_total{reason="first_chunk"}`, "kvindex_tokenize_requests_total", "kvindex_inflight_requests 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	t.Logf("%d requests: %v; picker %+v; tokenizer asked %d times", n, total, st, g.tok.Requests())
}

// oneRequest replays one request ending in a random way, and names it
// and the pod it went to ("" if none).
func oneRequest(g *gateway, rng *rand.Rand, body []byte) (kind, pod string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := envoytest.Open(ctx, g.client, g.mode)
	if err != nil {
		return "", "", err
	}
	kinds := []string{"full", "full", "full", "reset_before_body", "reset_after_pick", "reset_mid_response", "upstream_error", "no_body"}
	kind = kinds[rng.IntN(len(kinds))]
	if kind == "reset_before_body" {
		// Half the body, then the client goes away.
		err := s.Begin("/v1/chat/completions", body[:len(body)/2])
		s.Cancel()
		return kind, "", err
	}
	d, err := s.Request("/v1/chat/completions", body, 64+rng.IntN(512), nil)
	if err != nil {
		return "", "", err
	}
	if d.Status != 0 {
		return "", "", fmt.Errorf("picker answered %d", d.Status)
	}
	pod = g.pod(d.Header)
	switch kind {
	case "reset_after_pick":
		s.Cancel()
	case "reset_mid_response":
		if err := s.ResponseHeaders(200, false); err != nil {
			return "", "", err
		}
		if err := s.ResponseChunk([]byte("data: {}\n\n"), false); err != nil {
			return "", "", err
		}
		s.Cancel()
	case "upstream_error":
		if err := s.ResponseHeaders(503, false); err != nil {
			return "", "", err
		}
		if err := s.ResponseChunk([]byte("upstream connect error"), true); err != nil {
			return "", "", err
		}
		return kind, pod, s.Close()
	case "no_body":
		if err := s.ResponseHeaders(204, true); err != nil {
			return "", "", err
		}
		return kind, pod, s.Close()
	default:
		if err := s.ResponseHeaders(200, false); err != nil {
			return "", "", err
		}
		for i := range 3 {
			if err := s.ResponseChunk([]byte("data: {}\n\n"), i == 2); err != nil {
				return "", "", err
			}
		}
		return kind, pod, s.Close()
	}
	return kind, pod, nil
}

// TestGatewayColdThenPushPod: a gateway endpoint naming a push-mode pod
// (named by its address, as llm-d's topics name pods) is routable before
// its engine has said anything; once it announces blocks, its push-mode
// worker takes the cold one's place and the chat that it holds goes to it.
func TestGatewayColdThenPushPod(t *testing.T) {
	const pushPod = "10.2.0.1:8000"
	ts := httptest.NewServer(&standin.Handler{})
	t.Cleanup(ts.Close)
	f := newFleet(t, fleetOptions{configure: func(c *config.Config) {
		c.Models[0].TokenizerURLs = []string{ts.URL}
		c.Gateway = config.Gateway{Listen: "127.0.0.1:0", Endpoints: []config.Endpoint{
			{Address: pushPod, Model: model},
			{Address: "10.2.0.2:8000", Pod: "e1"},
		}}
	}}, podSpec{name: pushPod, push: true}, podSpec{name: "e1"})
	f.start()
	cc, err := grpc.NewClient(f.d.GatewayAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	g := &gateway{fleet: f, client: extprocv3.NewExternalProcessorClient(cc), addrs: map[string]string{pushPod: pushPod, "e1": "10.2.0.2:8000"}}
	chat := []tokenize.Message{{Role: "user", Content: sentence(900, 80)}}
	if st := f.status(pushPod, 0); st.GetEndpoint() != "gateway (cold)" {
		t.Fatalf("before its engine spoke: %v, want a cold worker", st)
	}
	s, _ := g.request(chat) // routable while cold
	if err := s.ResponseHeaders(200, false); err != nil {
		t.Fatal(err)
	}
	respond(t, s, 1)

	var eng engine
	ev, _ := eng.store(0, standin.Chat(chat, true))
	f.publish(pushPod, 0, ev)
	if st := f.status(pushPod, 0); st.GetEndpoint() == "gateway (cold)" || st.GetResidentBlocks() == 0 {
		t.Fatalf("after its engine spoke: %v, want the push-mode worker with blocks", st)
	}
	s, got := g.request(chat)
	if err := s.ResponseHeaders(200, false); err != nil {
		t.Fatal(err)
	}
	respond(t, s, 1)
	if got != pushPod {
		t.Fatalf("the chat the push pod holds went to %s", got)
	}
}

// TestGatewayAvoidsStale: the engine holding a conversation's history
// stops answering and goes stale; the next turn goes elsewhere, and while
// every endpoint is stale the picker still routes (stale_only).
func TestGatewayAvoidsStale(t *testing.T) {
	g := startGatewayWith(t, picker.FullDuplex, false, func(c *config.Config) { c.Events.StaleAfterDisconnect = 200 * time.Millisecond }, "e1", "e2")
	chat := []tokenize.Message{{Role: "user", Content: sentence(950, 60)}}
	g.cache("e1", standin.Chat(chat, true))
	s, got := g.request(chat)
	if got != "e1" {
		t.Fatalf("before: %s, want e1 (it holds the chat)", got)
	}
	g.finish(s, got, 1)
	g.pods["e1"].pubs[0].Close()
	g.waitFor(func() bool { return g.status("e1", 0).GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_STALE }, "e1 to go stale")
	s, got = g.request(chat)
	if got != "e2" {
		t.Fatalf("with e1 stale: %s, want e2", got)
	}
	g.finish(s, got, 1)
	g.pods["e2"].pubs[0].Close()
	g.waitFor(func() bool { return g.status("e2", 0).GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_STALE }, "e2 to go stale")
	s, _ = g.request(chat)
	g.finish(s, "either", 1)
	if st := g.d.Picker().Stats(); st.Decisions["stale_only"] != 1 {
		t.Fatalf("stats %+v, want one stale_only decision", st)
	}
}

// TestGatewayTokens: with auth.tokens the picker's ext_proc listener
// takes the gRPC API's tokens, sent as Envoy sends its grpc_service's
// initial_metadata: no or an unknown token is refused Unauthenticated, a
// read token PermissionDenied (Process routes: it needs scope route), a
// route token is served; refusals are counted under listener gateway; a
// rotated token file takes effect once the daemon has reloaded it.
func TestGatewayTokens(t *testing.T) {
	dir := t.TempDir()
	readFile, routeFile := filepath.Join(dir, "read"), filepath.Join(dir, "route")
	for f, secret := range map[string]string{readFile: readSecret, routeFile: routeSecret + "\n"} {
		if err := os.WriteFile(f, []byte(secret), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	g := startGatewayWith(t, picker.FullDuplex, false, func(c *config.Config) {
		c.Auth = config.Auth{Tokens: []config.Token{
			{Name: "dashboards", Scopes: []string{"read"}, File: readFile},
			{Name: "envoy", Scopes: []string{"route"}, File: routeFile},
		}}
	}, "e1", "e2")
	body, _ := json.Marshal(map[string]any{"model": model, "messages": []tokenize.Message{{Role: "user", Content: sentence(1, 40)}}})
	// pick replays one request with token ("" for none) and returns the
	// pod chosen, or the stream's gRPC status.
	pick := func(token string) (string, codes.Code) {
		t.Helper()
		ctx := context.Background()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		s, err := envoytest.Open(ctx, g.client, g.mode)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Cancel()
		d, err := s.Request("/v1/chat/completions", body, 512, nil)
		if err != nil {
			return "", status.Code(err)
		}
		if d.Status != 0 {
			t.Fatalf("token %q: picker answered %d", token, d.Status)
		}
		respond(t, s, 2)
		return g.pod(d.Header), codes.OK
	}
	for _, tc := range []struct {
		token string
		code  codes.Code
	}{
		{"", codes.Unauthenticated},
		{"not-a-token", codes.Unauthenticated},
		{readSecret, codes.PermissionDenied},
		{routeSecret, codes.OK},
	} {
		pod, code := pick(tc.token)
		if code != tc.code || (code == codes.OK) != (pod == "e1" || pod == "e2") {
			t.Errorf("token %q: pod %q, %v; want %v", tc.token, pod, code, tc.code)
		}
	}
	g.waitFor(func() bool { return g.d.InFlight() == 0 }, "the routed request to be released")
	want := []api.AuthRefusal{{Listener: api.ListenerGRPC, Reason: api.RefusedUnauthenticated}, {Listener: api.ListenerGRPC, Reason: api.RefusedDenied},
		{Listener: api.ListenerGateway, Reason: api.RefusedUnauthenticated, N: 2}, {Listener: api.ListenerGateway, Reason: api.RefusedDenied, N: 1},
		{Listener: api.ListenerMetrics, Reason: api.RefusedUnauthenticated}, {Listener: api.ListenerMetrics, Reason: api.RefusedDenied}}
	if got := g.d.Auth().RefusalsByListener(); !slices.Equal(got, want) {
		t.Errorf("refusals %+v, want %+v", got, want)
	}

	// Rotation.
	const rotated = "route-secret-rotated-987654"
	if err := os.WriteFile(routeFile, []byte(rotated), 0o600); err != nil {
		t.Fatal(err)
	}
	g.waitFor(func() bool { return g.d.Auth().Reloads() == 1 }, "the daemon to reload the token file")
	if _, code := pick(routeSecret); code != codes.Unauthenticated {
		t.Errorf("the rotated-out secret: %v, want Unauthenticated", code)
	}
	if pod, code := pick(rotated); code != codes.OK || pod == "" {
		t.Errorf("the new secret: pod %q, %v", pod, code)
	}
	code, _, m := httpGet(t, http.DefaultClient, "http://"+g.d.MetricsAddr()+"/metrics", readSecret)
	if code != http.StatusOK || !strings.Contains(m, `kvindex_auth_refused_total{listener="gateway",reason="unauthenticated"} 3`) {
		t.Errorf("/metrics: %d, gateway refusals not counted", code)
	}
}
