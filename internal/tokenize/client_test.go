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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/tokenize/standin"
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
	if !errors.Is(err, tokenize.ErrUnavailable) || !strings.Contains(err.Error(), a+"/tokenize") || !strings.Contains(err.Error(), b+"/tokenize") {
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
