package picker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/picker/envoytest"
	"github.com/kvindex/kvindex/scoring"
	"github.com/kvindex/kvindex/tokenize"
	"github.com/kvindex/kvindex/tokenize/standin"
)

const (
	model     = "m"
	blockSize = 16
)

// healthMap is a HealthSource the test sets.
type healthMap map[events.WorkerRef]*events.HealthCell

func (h healthMap) Health(r events.WorkerRef) *events.HealthCell { return h[r] }

// rig is an index with workers a/0, b/0, c/0 and c/1 (c serves both ranks
// at one address), the API server over it with a stand-in tokenizer over
// HTTP, and the picker served over gRPC on TCP loopback.
type rig struct {
	t       *testing.T
	ix      *indexer.Index
	workers map[string]*indexer.Worker
	tracker *scoring.Tracker
	health  healthMap
	picker  *picker.Picker
	client  extprocv3.ExternalProcessorClient
	mode    picker.BodyMode
	next    uint64
	tok     *tokenize.Client
}

var addrs = map[string]string{"a/0": "10.0.0.1:8000", "b/0": "10.0.0.2:8000", "c/0": "10.0.0.3:8000", "c/1": "10.0.0.3:8000"}

func newRig(t *testing.T, mode picker.BodyMode, opts picker.Options) *rig {
	t.Helper()
	hs := httptest.NewServer(&standin.Handler{})
	t.Cleanup(hs.Close)
	tk, err := tokenize.New(tokenize.Options{Endpoints: map[string][]string{model: {hs.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, ix: indexer.New(indexer.Config{}), workers: map[string]*indexer.Worker{}, mode: mode,
		tracker: scoring.NewTracker(scoring.TrackerOptions{}), health: healthMap{}, next: 1 << 40}
	if _, err := r.ix.AddModel(model, blockSize); err != nil {
		t.Fatal(err)
	}
	for _, w := range []events.WorkerRef{{Pod: "a"}, {Pod: "b"}, {Pod: "c"}, {Pod: "c", DPRank: 1}} {
		iw, err := r.ix.AddWorker(indexer.WorkerInfo{Ref: w, Model: model, Endpoint: "test"})
		if err != nil {
			t.Fatal(err)
		}
		r.workers[w.String()] = iw
		r.health[w] = &events.HealthCell{}
		r.health[w].Store(events.HealthOK)
		opts.Endpoints = append(opts.Endpoints, picker.Endpoint{Address: addrs[w.String()], Worker: w, Model: model, RankHeader: w.Pod == "c"})
	}
	r.tok = tk
	srv := api.NewServer(r.ix, nil, api.Options{Tokenizer: tk, Tracker: r.tracker})
	opts.Health, opts.BodyMode = r.health, mode
	r.picker, err = picker.New(srv, opts)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	r.picker.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	r.client = extprocv3.NewExternalProcessorClient(cc)
	return r
}

// hold makes worker w hold the blocks of toks.
func (r *rig) hold(w string, toks []uint32) {
	r.t.Helper()
	n := len(toks) / blockSize
	hashes := make([]uint64, n)
	for i := range hashes {
		r.next++
		hashes[i] = r.next
	}
	ev := events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: toks[:n*blockSize], BlockSize: blockSize, MediumName: "GPU"}
	if err := r.workers[w].ApplyBatch(&events.Batch{Timestamp: 1, Events: []events.Event{ev}}); err != nil {
		r.t.Fatal(err)
	}
}

func chatBody(msgs []tokenize.Message) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "stream": true})
	return b
}

func words(seed, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "s%d-%d ", seed, i)
	}
	return b.String()
}

// open starts a stream.
func (r *rig) open() *envoytest.Stream {
	r.t.Helper()
	s, err := envoytest.Open(context.Background(), r.client, r.mode)
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// waitInFlight waits until the tracker holds n requests.
func (r *rig) waitInFlight(n int) {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.tracker.InFlight() != n {
		if time.Now().After(deadline) {
			r.t.Fatalf("in flight %d, want %d", r.tracker.InFlight(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPickAndRelease: in both body modes, a chat and a completion land on
// the worker holding their prefix, the destination (chosen, then
// fallbacks) is in the header and the metadata alike, the body passes
// unchanged, and the request is in flight until the first response chunk.
func TestPickAndRelease(t *testing.T) {
	for _, mode := range []picker.BodyMode{picker.FullDuplex, picker.Buffered} {
		t.Run(fmt.Sprint("mode", mode), func(t *testing.T) {
			r := newRig(t, mode, picker.Options{Fallbacks: 1})
			chat := []tokenize.Message{{Role: "system", Content: words(1, 60)}, {Role: "user", Content: words(2, 40)}}
			r.hold("b/0", standin.Chat(chat, true))
			text := words(3, 90)
			r.hold("a/0", standin.Tokens(text, true))
			comp, _ := json.Marshal(map[string]any{"model": model, "prompt": text, "max_tokens": 8})
			for _, tc := range []struct {
				path string
				body []byte
				want string
			}{{"/v1/chat/completions", chatBody(chat), addrs["b/0"]}, {"/v1/completions", comp, addrs["a/0"]}} {
				s := r.open()
				d, err := s.Request(tc.path, tc.body, 100, nil)
				if err != nil {
					t.Fatal(err)
				}
				parts := strings.Split(d.Header, ",")
				if parts[0] != tc.want || len(parts) != 2 || parts[1] == parts[0] {
					t.Fatalf("%s: destination %q, want %s then one fallback", tc.path, d.Header, tc.want)
				}
				r.waitInFlight(1)
				if err := s.ResponseHeaders(200, false); err != nil {
					t.Fatal(err)
				}
				r.waitInFlight(1) // headers are not the end of the prefill
				if err := s.ResponseChunk([]byte("data: {}\n\n"), false); err != nil {
					t.Fatal(err)
				}
				r.waitInFlight(0)
				if err := s.ResponseChunk([]byte("data: [DONE]\n\n"), true); err != nil {
					t.Fatal(err)
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
			st := r.picker.Stats()
			if st.Decisions["routed"] != 2 || st.Releases["first_chunk"] != 2 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestReleaseOnErrorAndCancel: an error status and a stream reset before
// any response each release the request, counted by reason.
func TestReleaseOnErrorAndCancel(t *testing.T) {
	r := newRig(t, picker.FullDuplex, picker.Options{})
	body := chatBody([]tokenize.Message{{Role: "user", Content: words(4, 50)}})
	s := r.open()
	if _, err := s.Request("/v1/chat/completions", body, 0, nil); err != nil {
		t.Fatal(err)
	}
	r.waitInFlight(1)
	if err := s.ResponseHeadersServed(503, false, "10.0.0.9:8000"); err != nil {
		t.Fatal(err)
	}
	r.waitInFlight(0)
	_ = s.Close()

	s = r.open()
	if _, err := s.Request("/v1/chat/completions", body, 7, nil); err != nil {
		t.Fatal(err)
	}
	r.waitInFlight(1)
	s.Cancel()
	r.waitInFlight(0)
	deadline := time.Now().Add(5 * time.Second)
	for r.picker.Active() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	st := r.picker.Stats()
	if st.Releases["error_status"] != 1 || st.Releases["stream_closed"] != 1 || st.Active != 0 || st.Decisions["served_fallback"] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestEndpointChoice: the subset hint restricts the choice (an empty or
// foreign subset is 503), a stale worker is avoided, an address serving
// several ranks names the rank, a request without a prompt is routed by
// load, and a body over the limit is 413.
func TestEndpointChoice(t *testing.T) {
	r := newRig(t, picker.FullDuplex, picker.Options{MaxBodyBytes: 4096})
	chat := []tokenize.Message{{Role: "user", Content: words(5, 60)}}
	r.hold("a/0", standin.Chat(chat, true))
	r.hold("c/1", standin.Chat(chat, true))
	decide := func(body []byte, subset []string) envoytest.Decision {
		t.Helper()
		s := r.open()
		defer s.Close()
		d, err := s.Request("/v1/chat/completions", body, 0, subset)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := decide(chatBody(chat), []string{addrs["c/1"], addrs["b/0"]}); d.Header != addrs["c/1"] || d.Rank != "1" {
		t.Fatalf("subset {c, b}: %+v, want c rank 1", d)
	}
	if d := decide(chatBody(chat), []string{"10.9.9.9:8000"}); d.Status != 503 {
		t.Fatalf("foreign subset: %+v, want 503", d)
	}
	r.health[events.WorkerRef{Pod: "a"}].Store(events.HealthStale)
	r.health[events.WorkerRef{Pod: "c", DPRank: 1}].Store(events.HealthStale)
	if d := decide(chatBody(chat), nil); d.Header == addrs["a/0"] || (d.Header == addrs["c/1"] && d.Rank == "1") {
		t.Fatalf("stale holders: %+v, want neither", d)
	}
	if d := decide([]byte("not json"), nil); d.Status != 0 || d.Header == "" {
		t.Fatalf("no prompt: %+v, want routed by load", d)
	}
	if d := decide([]byte(fmt.Sprintf(`{"model":"m","prompt":%q}`, strings.Repeat("x", 5000))), nil); d.Status != 413 {
		t.Fatalf("large body: %+v, want 413", d)
	}
	st := r.picker.Stats()
	if st.Decisions["load_only"] != 1 || st.Decisions["too_large"] != 1 || st.Decisions["no_endpoint"] != 1 {
		t.Fatalf("stats %+v", st)
	}
	r.waitInFlight(0)
}

// TestSetEndpoints: the pool changes while the picker serves: a worker
// that leaves is no longer picked even though it holds the prompt, one
// that joins is picked when it holds it, an empty pool is 503, and a set
// New would refuse changes nothing.
func TestSetEndpoints(t *testing.T) {
	r := newRig(t, picker.FullDuplex, picker.Options{})
	chat := []tokenize.Message{{Role: "user", Content: words(6, 80)}}
	// Routing records speculative residency where it sends a prompt:
	// the joining worker's test asks for a prompt never routed before.
	later := []tokenize.Message{{Role: "user", Content: words(7, 80)}}
	r.hold("b/0", standin.Chat(chat, true))
	r.hold("b/0", standin.Chat(later, true))
	decideOn := func(chat []tokenize.Message) envoytest.Decision {
		t.Helper()
		s := r.open()
		defer s.Close()
		d, err := s.Request("/v1/chat/completions", chatBody(chat), 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	decide := func() envoytest.Decision { t.Helper(); return decideOn(chat) }
	if d := decide(); d.Header != addrs["b/0"] {
		t.Fatalf("before: %+v, want b", d)
	}
	all := r.picker.Endpoints()
	var withoutB []picker.Endpoint
	for _, e := range all {
		if e.Worker.Pod != "b" {
			withoutB = append(withoutB, e)
		}
	}
	if err := r.picker.SetEndpoints(withoutB); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if d := decide(); d.Status != 0 || d.Header == addrs["b/0"] {
			t.Fatalf("b left the pool: %+v, want another endpoint", d)
		}
	}
	if err := r.picker.SetEndpoints(append(withoutB, withoutB[0])); err == nil {
		t.Fatal("a worker listed twice was accepted")
	}
	if got := r.picker.Endpoints(); len(got) != len(withoutB) {
		t.Fatalf("a refused set changed the pool: %d endpoints, want %d", len(got), len(withoutB))
	}
	if err := r.picker.SetEndpoints(all); err != nil {
		t.Fatal(err)
	}
	if d := decideOn(later); d.Header != addrs["b/0"] {
		t.Fatalf("b back: %+v, want b", d)
	}
	if err := r.picker.SetEndpoints(nil); err != nil {
		t.Fatal(err)
	}
	if d := decide(); d.Status != 503 {
		t.Fatalf("empty pool: %+v, want 503", d)
	}
	if st := r.picker.Stats(); st.Endpoints != 0 || st.EndpointUpdates != 3 {
		t.Fatalf("stats %+v, want 0 endpoints after 3 updates", st)
	}
	r.waitInFlight(0)
}

// TestChunkedBodiesReuseBuffers: bodies that come in many chunks are
// gathered in buffers the picker reuses, and a chat's text is read in
// place from them: request after request, alternating between chats held
// by different workers, each lands on its holder and comes back
// unchanged (envoytest compares every byte), whether the tokenizer's
// cache answers or a round trip reads the text after the buffer went
// back to the pool.
func TestChunkedBodiesReuseBuffers(t *testing.T) {
	r := newRig(t, picker.FullDuplex, picker.Options{})
	chats := map[string][]tokenize.Message{}
	for i, w := range []string{"a/0", "b/0", "c/1"} {
		chats[w] = []tokenize.Message{{Role: "system", Content: words(20+i, 120)}, {Role: "user", Content: words(30+i, 10)}}
		r.hold(w, standin.Chat(chats[w], true))
	}
	for i := range 30 {
		w := []string{"a/0", "b/0", "c/1"}[i%3]
		s := r.open()
		d, err := s.Request("/v1/chat/completions", chatBody(chats[w]), 97+i, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.Header != addrs[w] {
			t.Fatalf("request %d: %+v, want %s (%s)", i, d, addrs[w], w)
		}
		_ = s.Close()
	}
	r.waitInFlight(0)
}
