package tokenize

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/internal/defaults"
)

// Errors of Tokenize, wrapped with the model and endpoints at fault.
var (
	ErrNoTokenizer = errors.New("tokenize: no tokenizer configured")
	// ErrUnavailable: no endpoint answered (refused, timeout, 5xx, garbled).
	ErrUnavailable = errors.New("tokenize: no tokenizer answered")
	// ErrRejected: an endpoint answered 4xx (too long, malformed messages).
	ErrRejected = errors.New("tokenize: prompt rejected")
	// ErrBusy: Options.MaxConcurrent round trips are already running.
	ErrBusy = errors.New("tokenize: too many concurrent tokenizations")
	// ErrTooLarge: the prompt exceeds Options.MaxPromptBytes or the answer
	// Options.MaxTokens.
	ErrTooLarge = errors.New("tokenize: over the limit")
)

// Defaults of Options.
const (
	DefaultTimeout        = 2 * time.Second
	DefaultCacheEntries   = 4096
	DefaultMaxConcurrent  = 64
	DefaultMaxPromptBytes = 4 << 20
	DefaultMaxTokens      = 1 << 20
	DefaultRenderRetry    = 10 * time.Minute
)

// The paths of a vLLM server that tokenize as a generation request would:
// render on newer servers (and the GPU-less render server), /tokenize on
// older ones.
const (
	RenderChatPath       = "/v1/chat/completions/render"
	RenderCompletionPath = "/v1/completions/render"
	TokenizePath         = "/tokenize"
)

// Options configures a Client; a zero field takes its Default*.
type Options struct {
	// Endpoints maps each model to the base URLs of servers that tokenize
	// for it, tried in turn.
	Endpoints map[string][]string
	// RenderRetry is how long a server found without render endpoints is
	// asked /tokenize only before render is tried again.
	RenderRetry time.Duration
	// Timeout bounds one tokenization, every endpoint tried included.
	Timeout time.Duration
	// CacheEntries bounds the cache of answers, 4 bytes a token plus ~100
	// each (negative: no cache).
	CacheEntries int
	// MaxConcurrent bounds round trips in flight; past it Tokenize fails
	// with ErrBusy.
	MaxConcurrent int
	// MaxPromptBytes bounds a request's text.
	MaxPromptBytes int
	// MaxTokens bounds an answer's tokens; its body is read up to 12 bytes
	// a token.
	MaxTokens  int
	HTTPClient *http.Client // nil: a client of its own
	// Registerer, when not nil, receives the kvindex_tokenize_* metrics.
	Registerer prometheus.Registerer
	Logger     *slog.Logger // nil: discarded
}

// Request is one text prompt of Model to tokenize: Prompt (a completion)
// or, when not nil, Messages (a chat).
type Request struct {
	Model    string
	Prompt   string
	Messages []Message
}

// Stats are a Client's counters since it was made.
type Stats struct {
	// Hits, Misses and Shared count Tokenize calls answered from the
	// cache, by a round trip of their own, and by joining an identical
	// round trip in flight.
	Hits, Misses, Shared int64
	// Failures counts calls that failed, Busy those of them refused by
	// Options.MaxConcurrent.
	Failures, Busy int64
	// Rendered and Tokenized count answers of a render endpoint and of
	// /tokenize; RenderMissing counts servers found without render
	// endpoints (each time one is tried again after RenderRetry).
	Rendered, Tokenized, RenderMissing int64
}

// Client tokenizes text prompts through the models' vLLM servers.
type Client struct {
	opts    Options
	http    *http.Client
	log     *slog.Logger
	cache   *lru.Cache[xxh3.Uint128, []uint32] // nil without a cache
	slots   chan struct{}                      // one per round trip in flight
	metrics *metrics                           // nil without a Registerer
	next    atomic.Uint64                      // the endpoint to start at
	servers map[string]*server                 // by base URL (no trailing /); built by New, read-only

	mu      sync.Mutex
	flights map[xxh3.Uint128]*flight // guarded by mu

	hits, misses, shared, failures, busy atomic.Int64
	rendered, tokenized, renderMissing   atomic.Int64
}

// server is what a Client remembers of one tokenizer endpoint.
type server struct {
	base string
	// tokenizeUntil is the time (Unix nanoseconds) until which the server
	// is asked /tokenize only: it answered a render endpoint as a server
	// without one does. 0: render is tried.
	tokenizeUntil atomic.Int64
}

// flight is one round trip that identical requests wait on.
type flight struct {
	done   chan struct{}
	tokens []uint32
	err    error
}

// New returns a Client; it fails on an endpoint not an http(s) URL.
func New(opts Options) (*Client, error) {
	defaults.Positive(&opts.Timeout, DefaultTimeout)
	defaults.Zero(&opts.CacheEntries, DefaultCacheEntries)
	defaults.Zero(&opts.MaxConcurrent, DefaultMaxConcurrent)
	defaults.Zero(&opts.MaxPromptBytes, DefaultMaxPromptBytes)
	defaults.Zero(&opts.MaxTokens, DefaultMaxTokens)
	defaults.Positive(&opts.RenderRetry, DefaultRenderRetry)
	servers := map[string]*server{}
	for m, eps := range opts.Endpoints {
		for _, ep := range eps {
			if !strings.HasPrefix(ep, "http://") && !strings.HasPrefix(ep, "https://") {
				return nil, fmt.Errorf("tokenize: model %q: endpoint %q is not an http(s) URL", m, ep)
			}
			base := strings.TrimSuffix(ep, "/")
			servers[base] = &server{base: base}
		}
	}
	c := &Client{opts: opts, http: opts.HTTPClient, log: opts.Logger, slots: make(chan struct{}, opts.MaxConcurrent), flights: map[xxh3.Uint128]*flight{}, servers: servers}
	if c.http == nil {
		c.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: opts.MaxConcurrent, IdleConnTimeout: 90 * time.Second}}
	}
	defaults.Zero(&c.log, slog.New(slog.DiscardHandler))
	if opts.CacheEntries > 0 {
		c.cache, _ = lru.New[xxh3.Uint128, []uint32](opts.CacheEntries) // size > 0 cannot fail
	}
	if opts.Registerer != nil {
		c.metrics = newMetrics(opts.Registerer, c)
	}
	return c, nil
}

// Stats returns the counters.
func (c *Client) Stats() Stats {
	return Stats{Hits: c.hits.Load(), Misses: c.misses.Load(), Shared: c.shared.Load(), Failures: c.failures.Load(), Busy: c.busy.Load(),
		Rendered: c.rendered.Load(), Tokenized: c.tokenized.Load(), RenderMissing: c.renderMissing.Load()}
}

// Tokenize returns the token ids the model's engine sees for req: from
// the cache, an identical round trip in flight, or its own round trip.
// The result is shared: do not modify it. req is not retained.
//
// Cost: a cache hit is one hash of the request's text (cacheKey); a miss
// adds encoding it as JSON and one HTTP round trip.
func (c *Client) Tokenize(ctx context.Context, req Request) ([]uint32, error) {
	toks, err := c.tokenize(ctx, &req)
	if err != nil {
		c.failures.Add(1)
		c.metrics.failed(err)
	}
	return toks, err
}

func (c *Client) tokenize(ctx context.Context, req *Request) ([]uint32, error) {
	eps := c.opts.Endpoints[req.Model]
	if len(eps) == 0 {
		return nil, fmt.Errorf("%w for model %q", ErrNoTokenizer, req.Model)
	}
	n := len(req.Prompt)
	for _, m := range req.Messages {
		n += len(m.Content) + len(m.Role)
	}
	if n > c.opts.MaxPromptBytes {
		return nil, fmt.Errorf("%w: model %q: prompt of %d bytes exceeds %d", ErrTooLarge, req.Model, n, c.opts.MaxPromptBytes)
	}
	key := cacheKey(req)
	if c.cache != nil {
		if toks, ok := c.cache.Get(key); ok {
			c.hits.Add(1)
			return toks, nil
		}
	}
	c.mu.Lock()
	if f, ok := c.flights[key]; ok {
		c.mu.Unlock()
		c.shared.Add(1)
		select {
		case <-f.done:
			return f.tokens, f.err
		case <-ctx.Done():
			return nil, fmt.Errorf("tokenize: model %q: waiting for an identical request: %w", req.Model, ctx.Err())
		}
	}
	select {
	case c.slots <- struct{}{}:
	default:
		c.mu.Unlock()
		c.busy.Add(1)
		return nil, fmt.Errorf("%w: model %q: %d in flight", ErrBusy, req.Model, c.opts.MaxConcurrent)
	}
	f := &flight{done: make(chan struct{})}
	c.flights[key] = f
	c.mu.Unlock()
	c.misses.Add(1)
	req = cloneRequest(req) // the round trip may outlive the caller's strings

	// The round trip outlives a caller that gives up: others may be
	// waiting on it, and its answer is cached. Timeout bounds it.
	go func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.Timeout)
		start := time.Now()
		if body, err := json.Marshal(wireRequest(req)); err != nil {
			f.err = fmt.Errorf("tokenize: model %q: encode: %w", req.Model, err)
		} else {
			f.tokens, f.err = c.roundTrip(rctx, req.Model, req.Messages != nil, eps, body)
		}
		cancel()
		if c.metrics != nil {
			c.metrics.duration.Observe(time.Since(start).Seconds())
		}
		if f.err == nil && c.cache != nil {
			c.cache.Add(key, f.tokens)
		}
		c.mu.Lock()
		delete(c.flights, key)
		c.mu.Unlock()
		<-c.slots
		close(f.done)
	}()
	select {
	case <-f.done:
		return f.tokens, f.err
	case <-ctx.Done():
		return nil, fmt.Errorf("tokenize: model %q: %w", req.Model, ctx.Err())
	}
}

// cloneRequest is a copy of req sharing no memory with it.
func cloneRequest(req *Request) *Request {
	out := &Request{Model: strings.Clone(req.Model), Prompt: strings.Clone(req.Prompt)}
	if req.Messages != nil {
		out.Messages = make([]Message, len(req.Messages))
		for i, m := range req.Messages {
			out.Messages[i] = Message{Role: strings.Clone(m.Role), Content: strings.Clone(m.Content)}
		}
	}
	return out
}

// cacheKey is the cache and single-flight key of req: a 128-bit xxh3 of
// its model, kind and text, each length-prefixed. Cost: one pass over the
// text (about 3 µs for a 4,096-token chat).
func cacheKey(req *Request) xxh3.Uint128 {
	h := xxh3.New()
	var n [8]byte
	str := func(s string) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		_, _ = h.Write(n[:])
		_, _ = h.WriteString(s)
	}
	str(req.Model)
	if req.Messages == nil {
		str("prompt")
		str(req.Prompt)
	} else {
		str("chat")
		for _, m := range req.Messages {
			str(m.Role)
			str(m.Content)
		}
	}
	return h.Sum128()
}

// roundTrip posts body, the same for render and /tokenize, to the
// model's endpoints in turn until one answers.
func (c *Client) roundTrip(ctx context.Context, model string, chat bool, eps []string, body []byte) ([]uint32, error) {
	first := int(c.next.Add(1) % uint64(len(eps)))
	var failed []string
	for i := range eps {
		srv := c.servers[strings.TrimSuffix(eps[(first+i)%len(eps)], "/")]
		toks, url, err := c.ask(ctx, srv, chat, body)
		if err == nil {
			return toks, nil
		}
		if errors.Is(err, ErrRejected) || errors.Is(err, ErrTooLarge) {
			return nil, fmt.Errorf("model %q: %w", model, err)
		}
		c.log.Warn("tokenizer did not answer", "model", model, "endpoint", url, "err", err)
		failed = append(failed, err.Error())
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("%w for model %q: %s", ErrUnavailable, model, strings.Join(failed, "; "))
}

// ask tokenizes through one server: its render endpoint unless it is
// known to have none, then /tokenize if it answers as a server without
// one does (remembered for Options.RenderRetry).
func (c *Client) ask(ctx context.Context, srv *server, chat bool, body []byte) ([]uint32, string, error) {
	if until := srv.tokenizeUntil.Load(); until == 0 || time.Now().UnixNano() >= until {
		path := RenderCompletionPath
		if chat {
			path = RenderChatPath
		}
		url := srv.base + path
		toks, err := c.post(ctx, url, body, decodeRender)
		if !errors.Is(err, errNoRender) {
			if err == nil {
				srv.tokenizeUntil.Store(0)
				c.rendered.Add(1)
			}
			return toks, url, err
		}
		srv.tokenizeUntil.Store(time.Now().Add(c.opts.RenderRetry).UnixNano())
		c.renderMissing.Add(1)
		c.log.Info("tokenizer has no render endpoint: using /tokenize", "endpoint", url, "retry_after", c.opts.RenderRetry, "err", err)
	}
	url := srv.base + TokenizePath
	toks, err := c.post(ctx, url, body, decodeTokenize)
	if err == nil {
		c.tokenized.Add(1)
	}
	return toks, url, err
}

// errNoRender is post's answer from a server without the render
// endpoint: a 404 that is not vLLM's error object (a route that does not
// exist; vLLM's own 404, an unknown model, is an error object), a 405, or
// a 501 (the model does not support the render API).
var errNoRender = errors.New("tokenize: no render endpoint")

func (c *Client) post(ctx context.Context, url string, body []byte, decode func([]byte) ([]uint32, error)) ([]uint32, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	defer resp.Body.Close()
	limit := int64(c.opts.MaxTokens)*12 + 4096
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: read answer: %w", url, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && !isVLLMError(data),
		resp.StatusCode == http.StatusMethodNotAllowed, resp.StatusCode == http.StatusNotImplemented:
		return nil, fmt.Errorf("%w: %s: %s: %s", errNoRender, url, resp.Status, snippet(data))
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return nil, fmt.Errorf("%w: %s: %s: %s", ErrRejected, url, resp.Status, snippet(data))
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, snippet(data))
	case int64(len(data)) > limit:
		return nil, fmt.Errorf("%w: %s: answer longer than %d bytes", ErrTooLarge, url, limit)
	}
	toks, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: answer %s: %w", url, snippet(data), err)
	}
	if len(toks) > c.opts.MaxTokens {
		return nil, fmt.Errorf("%w: %s: %d tokens exceed %d", ErrTooLarge, url, len(toks), c.opts.MaxTokens)
	}
	if toks == nil {
		toks = []uint32{}
	}
	return toks, nil
}

// isVLLMError reports whether an answer is vLLM's error object
// ({"error": {...}}), as opposed to a web framework's "no such route".
func isVLLMError(data []byte) bool {
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	return json.Unmarshal(data, &e) == nil && len(e.Error) > 0 && string(e.Error) != "null"
}

func decodeTokenize(data []byte) ([]uint32, error) {
	var wr WireResponse
	if err := json.Unmarshal(data, &wr); err != nil {
		return nil, err
	}
	return wr.Tokens, nil
}

// decodeRender reads a render answer: one WireRender (a chat) or a list
// of them, one per prompt (a completion; the request had one prompt).
func decodeRender(data []byte) ([]uint32, error) {
	data = bytes.TrimSpace(data)
	list := make([]WireRender, 1)
	var err error
	if len(data) > 0 && data[0] == '[' {
		list = nil
		err = json.Unmarshal(data, &list)
	} else {
		err = json.Unmarshal(data, &list[0])
	}
	switch {
	case err != nil:
		return nil, err
	case len(list) != 1:
		return nil, fmt.Errorf("%d rendered prompts, want 1", len(list))
	case list[0].TokenIDs == nil:
		return nil, errors.New("no token_ids")
	}
	return list[0].TokenIDs, nil
}

// snippet quotes the start of an answer for an error.
func snippet(b []byte) string {
	const n = 64
	if len(b) > n {
		return fmt.Sprintf("%q...", b[:n])
	}
	return fmt.Sprintf("%q", b)
}
