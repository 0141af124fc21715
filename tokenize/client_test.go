package tokenize_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/tokenize"
	"github.com/kvindex/kvindex/tokenize/standin"
)

const model = "test/model"

// gated serves the stand-in tokenizer, each request first waiting for
// gate to be closed (when not nil).
func serve(t *testing.T, h http.Handler, gate chan struct{}) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if gate != nil {
			<-gate
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// deadURL is an http URL nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func newClient(t *testing.T, o tokenize.Options) *tokenize.Client {
	t.Helper()
	c, err := tokenize.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTokenizeMatchesStandin(t *testing.T) {
	h := &standin.Handler{}
	c := newClient(t, tokenize.Options{Endpoints: map[string][]string{model: {serve(t, h, nil)}}})
	ctx := context.Background()
	got, err := c.Tokenize(ctx, tokenize.Request{Model: model, Prompt: "the quick brown fox"})
	if err != nil {
		t.Fatal(err)
	}
	if want := standin.Tokens("the quick brown fox", true); !slices.Equal(got, want) {
		t.Fatalf("prompt: %v, want %v", got, want)
	}
	msgs := []tokenize.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello there"}}
	got, err = c.Tokenize(ctx, tokenize.Request{Model: model, Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	if want := standin.Chat(msgs, true); !slices.Equal(got, want) {
		t.Fatalf("chat: %v, want %v", got, want)
	}
	// The same chat again comes from the cache.
	if _, err := c.Tokenize(ctx, tokenize.Request{Model: model, Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Hits != 1 || st.Misses != 2 || h.Requests() != 2 {
		t.Fatalf("stats %+v, server requests %d; want 1 hit, 2 misses, 2 requests", st, h.Requests())
	}
	// A prompt and a chat of the same text are different entries.
	if _, err := c.Tokenize(ctx, tokenize.Request{Model: model, Messages: []tokenize.Message{{Role: "user", Content: "the quick brown fox"}}}); err != nil {
		t.Fatal(err)
	}
	if h.Requests() != 3 {
		t.Fatalf("a chat with a cached prompt's text was answered from the cache")
	}
}

// TestSingleFlight: identical prompts asked at once cost one round trip,
// and every caller gets its answer.
func TestSingleFlight(t *testing.T) {
	h := &standin.Handler{}
	gate := make(chan struct{})
	reg := prometheus.NewRegistry()
	c := newClient(t, tokenize.Options{Endpoints: map[string][]string{model: {serve(t, h, gate)}}, Registerer: reg})
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: "one shared prompt"})
			if err == nil && !slices.Equal(toks, standin.Tokens("one shared prompt", true)) {
				err = fmt.Errorf("tokens %v", toks)
			}
			errs <- err
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for st := c.Stats(); st.Misses+st.Shared < n; st = c.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("callers did not arrive: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.Misses != 1 || st.Shared != n-1 || h.Requests() != 1 {
		t.Fatalf("stats %+v, server requests %d; want 1 round trip", st, h.Requests())
	}
	if v := testutil.ToFloat64(collectorFor(t, reg, "kvindex_tokenize_requests_total", "shared")); v != n-1 {
		t.Fatalf("kvindex_tokenize_requests_total{result=shared} = %v", v)
	}
}

// collectorFor reads one labelled sample from reg.
func collectorFor(t *testing.T, reg *prometheus.Registry, name, label string) prometheus.Collector {
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
			for _, lp := range m.GetLabel() {
				if lp.GetValue() == label {
					g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
					g.Set(m.GetCounter().GetValue())
					return g
				}
			}
		}
	}
	t.Fatalf("no %s{%s}", name, label)
	return nil
}

// TestUnavailableNamesEndpoints: with no endpoint answering, the error is
// ErrUnavailable naming each one; a dead endpoint is skipped for a live
// one.
func TestUnavailableNamesEndpoints(t *testing.T) {
	a, b := deadURL(t), deadURL(t)
	c := newClient(t, tokenize.Options{Endpoints: map[string][]string{model: {a, b}}})
	_, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: "x"})
	if !errors.Is(err, tokenize.ErrUnavailable) || !strings.Contains(err.Error(), a+tokenize.RenderCompletionPath) || !strings.Contains(err.Error(), b+tokenize.RenderCompletionPath) {
		t.Fatalf("err %v, want ErrUnavailable naming %s and %s", err, a, b)
	}
	live := serve(t, &standin.Handler{}, nil)
	c = newClient(t, tokenize.Options{Endpoints: map[string][]string{model: {a, live}}})
	for i := range 4 { // each endpoint is tried first in turn
		if _, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: fmt.Sprint("p", i)}); err != nil {
			t.Fatalf("with a live endpoint: %v", err)
		}
	}
	if _, err := c.Tokenize(context.Background(), tokenize.Request{Model: "other", Prompt: "x"}); !errors.Is(err, tokenize.ErrNoTokenizer) {
		t.Fatalf("unknown model: %v", err)
	}
}

// TestTimeout: an endpoint slower than Options.Timeout is unavailable.
func TestTimeout(t *testing.T) {
	gate := make(chan struct{})
	defer close(gate)
	c := newClient(t, tokenize.Options{Endpoints: map[string][]string{model: {serve(t, &standin.Handler{}, gate)}}, Timeout: 50 * time.Millisecond})
	start := time.Now()
	_, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: "slow"})
	if !errors.Is(err, tokenize.ErrUnavailable) || time.Since(start) > 2*time.Second {
		t.Fatalf("err %v after %v, want ErrUnavailable after ~50ms", err, time.Since(start))
	}
}

// TestBounds: round trips past MaxConcurrent are refused (ErrBusy), a
// prompt over MaxPromptBytes is refused before it is sent, and a prompt
// the server rejects (too long for the model) is ErrRejected.
func TestBounds(t *testing.T) {
	gate := make(chan struct{})
	h := &standin.Handler{MaxModelLen: 8}
	c := newClient(t, tokenize.Options{Endpoints: map[string][]string{model: {serve(t, h, gate)}}, MaxConcurrent: 1, MaxPromptBytes: 1000})
	done := make(chan error, 1)
	go func() {
		_, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: "first"})
		done <- err
	}()
	for c.Stats().Misses == 0 {
		time.Sleep(time.Millisecond)
	}
	if _, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: "second"}); !errors.Is(err, tokenize.ErrBusy) {
		t.Fatalf("second concurrent: %v, want ErrBusy", err)
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: strings.Repeat("x", 1001)}); !errors.Is(err, tokenize.ErrTooLarge) {
		t.Fatalf("long prompt: %v, want ErrTooLarge", err)
	}
	if _, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: "one two three four five six seven eight nine"}); !errors.Is(err, tokenize.ErrRejected) {
		t.Fatalf("prompt past max_model_len: %v, want ErrRejected", err)
	}
	if st := c.Stats(); st.Busy != 1 || st.Failures != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRenderPreferred: a server with render endpoints is asked those (a
// chat at /v1/chat/completions/render, a prompt at
// /v1/completions/render), never /tokenize, with the same ids.
func TestRenderPreferred(t *testing.T) {
	h := &standin.Handler{}
	c := newClient(t, tokenize.Options{Endpoints: map[string][]string{model: {serve(t, h, nil)}}})
	msgs := []tokenize.Message{{Role: "user", Content: "hello there"}}
	got, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Messages: msgs})
	if err != nil || !slices.Equal(got, standin.Chat(msgs, true)) {
		t.Fatalf("chat: %v %v, want %v", got, err, standin.Chat(msgs, true))
	}
	got, err = c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: "the quick brown fox"})
	if err != nil || !slices.Equal(got, standin.Tokens("the quick brown fox", true)) {
		t.Fatalf("prompt: %v %v", got, err)
	}
	if st := c.Stats(); st.Rendered != 2 || st.Tokenized != 0 || st.RenderMissing != 0 || h.Renders() != 2 || h.Requests() != 2 {
		t.Fatalf("stats %+v, handler renders %d of %d", st, h.Renders(), h.Requests())
	}
}

// TestRenderFallback: a server without render endpoints (404, no such
// route) is asked /tokenize at once and then only /tokenize, remembered
// per server, until RenderRetry passes; a 404 that is vLLM's error object
// (an unknown model) is a rejection, not a missing endpoint.
func TestRenderFallback(t *testing.T) {
	old, cur := &standin.Handler{NoRender: true}, &standin.Handler{}
	oldURL, curURL := serve(t, old, nil), serve(t, cur, nil)
	c := newClient(t, tokenize.Options{Endpoints: map[string][]string{model: {oldURL, curURL}}, RenderRetry: 200 * time.Millisecond})
	for i := range 6 { // each server first in turn
		msgs := []tokenize.Message{{Role: "user", Content: fmt.Sprint("turn ", i)}}
		got, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Messages: msgs})
		if err != nil || !slices.Equal(got, standin.Chat(msgs, true)) {
			t.Fatalf("request %d: %v %v", i, got, err)
		}
	}
	if old.RenderMisses() != 1 || old.Requests() != 3 || old.Renders() != 0 || cur.Renders() != 3 {
		t.Fatalf("old server: %d render misses, %d answers; current: %d renders; want 1, 3, 3", old.RenderMisses(), old.Requests(), cur.Renders())
	}
	if st := c.Stats(); st.Rendered != 3 || st.Tokenized != 3 || st.RenderMissing != 1 {
		t.Fatalf("stats %+v", st)
	}
	time.Sleep(250 * time.Millisecond) // past RenderRetry: render is tried again
	for i := range 2 {
		if _, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: fmt.Sprint("later ", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if old.RenderMisses() != 2 {
		t.Fatalf("render misses %d after the retry, want 2", old.RenderMisses())
	}

	strict := &standin.Handler{Models: []string{"another/model"}}
	c = newClient(t, tokenize.Options{Endpoints: map[string][]string{model: {serve(t, strict, nil)}}})
	if _, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: "x"}); !errors.Is(err, tokenize.ErrRejected) {
		t.Fatalf("unknown model: %v, want ErrRejected", err)
	}
	if st := c.Stats(); st.RenderMissing != 0 || st.Tokenized != 0 {
		t.Fatalf("an unknown model fell back to /tokenize: %+v", st)
	}
}

// TestRenderWireAnswers: render answers as vLLM writes them (a
// GenerateRequest for a chat, a list of them for a completion, every
// field present) are read; a list of two prompts is refused.
func TestRenderWireAnswers(t *testing.T) {
	const chat = `{"request_id":"3f1c2a9e0b6d4c1e8a7f5b2d9c0e1f3a","token_ids":[128000,128006,882,128007,271,15339,128009,128006,78191,128007,271],` +
		`"features":null,"sampling_params":{"n":1,"presence_penalty":0.0,"frequency_penalty":0.0,"repetition_penalty":1.0,"temperature":1.0,"top_p":1.0,"top_k":0,"seed":null,"stop":[],"max_tokens":null,"min_tokens":0,"logprobs":null},` +
		`"model":"test/model","stream":false,"stream_options":null,"cache_salt":null,"priority":0,"kv_transfer_params":null}`
	const comp = `[{"request_id":"a1","token_ids":[128000,791,4062,14198,39935],"features":null,"sampling_params":{"n":1,"max_tokens":16},"model":"test/model","stream":false,"stream_options":null,"cache_salt":null,"priority":0,"kv_transfer_params":null}]`
	const two = `[{"request_id":"a","token_ids":[1],"sampling_params":{}},{"request_id":"b","token_ids":[2],"sampling_params":{}}]`
	answer := comp
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case tokenize.RenderChatPath:
			_, _ = w.Write([]byte(chat))
		case tokenize.RenderCompletionPath:
			_, _ = w.Write([]byte(answer))
		default:
			t.Errorf("asked %s", r.URL.Path)
			w.WriteHeader(http.StatusInternalServerError)
		}
	}), nil)
	c := newClient(t, tokenize.Options{Endpoints: map[string][]string{model: {srv}}, CacheEntries: -1})
	got, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Messages: []tokenize.Message{{Role: "user", Content: "Hello"}}})
	if want := []uint32{128000, 128006, 882, 128007, 271, 15339, 128009, 128006, 78191, 128007, 271}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("chat: %v %v, want %v", got, err, want)
	}
	got, err = c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: "The quick brown fox"})
	if want := []uint32{128000, 791, 4062, 14198, 39935}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("completion: %v %v, want %v", got, err, want)
	}
	answer = two
	if _, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Prompt: "two"}); !errors.Is(err, tokenize.ErrUnavailable) || !strings.Contains(err.Error(), "2 rendered prompts") {
		t.Fatalf("two prompts rendered: %v", err)
	}
}

// TestMissCopiesText: a caller's strings may share a buffer it reuses as
// soon as Tokenize returns, even when the round trip outlives the call
// (the caller gave up): the round trip works on a copy, so the answer
// cached is the original text's. Under -race, reading the caller's
// buffer after the call would be reported.
func TestMissCopiesText(t *testing.T) {
	gate := make(chan struct{})
	h := &standin.Handler{}
	c := newClient(t, tokenize.Options{Endpoints: map[string][]string{model: {serve(t, h, gate)}}})
	buf := []byte("a system prompt that the caller reuses")
	shared := unsafe.String(&buf[0], len(buf))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Tokenize(ctx, tokenize.Request{Model: model, Messages: []tokenize.Message{{Role: "system", Content: shared}}})
		done <- err
	}()
	for c.Stats().Misses == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled call: %v", err)
	}
	copy(buf, "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX") // the caller reuses its buffer
	close(gate)
	want := standin.Chat([]tokenize.Message{{Role: "system", Content: "a system prompt that the caller reuses"}}, true)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := c.Tokenize(context.Background(), tokenize.Request{Model: model, Messages: []tokenize.Message{{Role: "system", Content: "a system prompt that the caller reuses"}}})
		if err != nil {
			t.Fatal(err)
		}
		if c.Stats().Hits > 0 {
			if !slices.Equal(got, want) {
				t.Fatalf("cached %v, want the original text's %v", got, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first round trip's answer was never cached")
		}
		time.Sleep(time.Millisecond)
	}
}
