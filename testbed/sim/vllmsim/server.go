package vllmsim

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvindex/kvindex/testbed/enginepub"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/workload"
	"github.com/kvindex/kvindex/tokenize"
	"github.com/kvindex/kvindex/tokenize/standin"
)

// Config sets up a Server.
type Config struct {
	Model string // served model name (vLLM's --served-model-name)
	Pod   string // the engine's name in its topic, kv@<pod>@<model>
	// Publish and Replay ("": none) are the KV event PUB and replay
	// ROUTER endpoints, e.g. tcp://*:5557 and tcp://*:5567.
	Publish, Replay string
	HTTPListen      string // the API and /metrics address, e.g. :8000
	Engine          engine.Config
	Logger          *slog.Logger // nil: discarded
}

// maxTokens caps a request's max_tokens.
const maxTokens = 4096

// Server is one simulated vLLM engine, served.
type Server struct {
	cfg  Config
	pub  *enginepub.Publisher
	lis  net.Listener
	http *http.Server
	tok  *standin.Handler // /tokenize and the render endpoints
	work chan struct{}    // a request was submitted
	t0   time.Time

	mu      sync.Mutex // guards eng, waiters, nextID and the counters below
	eng     *engine.Engine
	waiters map[*workload.Request]*waiter
	nextID  int
	// counters, exported under vLLM's names
	queries, hits, promptToks, genToks, success int64
}

// waiter is a request's caller, waiting for its last token.
type waiter struct {
	done   chan struct{}
	cached int
}

// ErrBadRequest is wrapped by errors about a request the API refuses.
var ErrBadRequest = errors.New("vllmsim: bad request")

// New binds the event sockets and the HTTP listener. Nothing is served
// until Run.
func New(cfg Config) (*Server, error) {
	if cfg.Model == "" || cfg.Pod == "" || cfg.Publish == "" {
		return nil, errors.New("vllmsim: model, pod and publish endpoint are required")
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.Engine.Events = true
	eng, err := engine.New(0, cfg.Engine)
	if err != nil {
		return nil, fmt.Errorf("vllmsim: %w", err)
	}
	s := &Server{cfg: cfg, eng: eng, waiters: map[*workload.Request]*waiter{}, work: make(chan struct{}, 1), t0: time.Now()}
	s.cfg.Engine = eng.Config()
	s.pub, err = enginepub.NewPublisher(enginepub.PublisherConfig{
		Endpoint: cfg.Publish, Topic: "kv@" + cfg.Pod + "@" + cfg.Model, Bind: true,
		ReplayEndpoint: cfg.Replay,
	})
	if err != nil {
		return nil, fmt.Errorf("vllmsim: event publisher at %s: %w", cfg.Publish, err)
	}
	if s.lis, err = net.Listen("tcp", cfg.HTTPListen); err != nil {
		s.pub.Close()
		return nil, fmt.Errorf("vllmsim: listen on %s: %w", cfg.HTTPListen, err)
	}
	reg := prometheus.NewRegistry()
	s.registerMetrics(reg)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.completion(false))
	mux.HandleFunc("POST /v1/chat/completions", s.completion(true))
	mux.HandleFunc("GET /v1/models", s.models)
	s.tok = &standin.Handler{Models: []string{cfg.Model}, MaxModelLen: s.cfg.Engine.CacheBlocks * s.cfg.Engine.BlockSize}
	for _, path := range []string{tokenize.TokenizePath, tokenize.RenderChatPath, tokenize.RenderCompletionPath} {
		mux.Handle("POST "+path, s.tok)
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return s, nil
}

// Addr is the HTTP listener's address.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Run serves until ctx is done, then closes the sockets.
func (s *Server) Run(ctx context.Context) error {
	defer s.pub.Close()
	errc := make(chan error, 1)
	go func() {
		if err := s.http.Serve(s.lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("vllmsim: serve: %w", err)
		}
	}()
	s.cfg.Logger.Info("simulated vLLM engine serving", "model", s.cfg.Model, "pod", s.cfg.Pod, "http", s.Addr(), "events", s.cfg.Publish, "replay", s.cfg.Replay,
		"block_size", s.cfg.Engine.BlockSize, "cache_blocks", s.cfg.Engine.CacheBlocks)
	loopDone := make(chan struct{})
	go func() { defer close(loopDone); s.loop(ctx) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.http.Shutdown(sctx)
	<-loopDone
	return err
}

func (s *Server) now() time.Duration { return time.Since(s.t0) }

// loop runs engine steps on the wall clock: each takes the time model's
// duration, then finishStep publishes its batch and answers its requests.
func (s *Server) loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		d, ok := s.eng.StartStep(s.now())
		s.mu.Unlock()
		if !ok {
			select {
			case <-ctx.Done():
				s.failAll()
				return
			case <-s.work:
				continue
			}
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			s.failAll()
			return
		case <-timer.C:
		}
		s.finishStep()
	}
}

func (s *Server) finishStep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := s.eng.FinishStep(s.now())
	if res.Batch != nil {
		res.Batch.Timestamp = float64(time.Now().UnixNano()) / 1e9
		if _, err := s.pub.Publish(res.Batch); err != nil {
			s.cfg.Logger.Error("publishing KV events failed", "err", err)
		}
	}
	for _, ft := range res.FirstTokens {
		s.queries += int64(ft.Req.PromptLen)
		s.hits += int64(ft.CachedTokens)
		if w := s.waiters[ft.Req]; w != nil {
			w.cached = ft.CachedTokens
		}
	}
	for _, r := range res.Finished {
		s.genToks += int64(r.OutputLen)
		s.success++
		if w := s.waiters[r]; w != nil {
			close(w.done)
			delete(s.waiters, r)
		}
	}
}

// failAll wakes every waiting request.
func (s *Server) failAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for r, w := range s.waiters {
		close(w.done)
		delete(s.waiters, r)
	}
}

// serve runs one request of prompt segs for n tokens and returns its
// prompt length and cached prompt tokens once it finished.
func (s *Server) serve(ctx context.Context, segs []workload.Segment, n int) (prompt, cached int, err error) {
	if len(segs) == 0 {
		return 0, 0, fmt.Errorf("%w: empty prompt", ErrBadRequest)
	}
	req := &workload.Request{Prompt: segs, OutputLen: n}
	for _, sg := range segs {
		req.PromptLen += sg.Len
	}
	w := &waiter{done: make(chan struct{})}
	s.mu.Lock()
	req.ID = s.nextID
	s.nextID++
	content := req.AppendBlockContent(nil, s.cfg.Engine.BlockSize, req.OutputSegment(s.cfg.Engine.OutputSeed))
	if !s.eng.Submit(req, content) {
		s.mu.Unlock()
		return 0, 0, fmt.Errorf("%w: %d prompt + %d output tokens exceed the KV cache (%d blocks of %d)", ErrBadRequest, req.PromptLen, n, s.cfg.Engine.CacheBlocks, s.cfg.Engine.BlockSize)
	}
	s.promptToks += int64(req.PromptLen)
	s.waiters[req] = w
	s.mu.Unlock()
	select {
	case s.work <- struct{}{}:
	default:
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		// The engine finishes the request anyway, as vLLM finishes an
		// aborted one's current step; its waiter is dropped then.
		return 0, 0, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return req.PromptLen, w.cached, nil
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// completionRequest is what the simulator reads of OpenAI's completion
// and chat requests.
type completionRequest struct {
	Model               string                 `json:"model"`
	Prompt              any                    `json:"prompt"`
	Messages            []tokenize.WireMessage `json:"messages"`
	MaxTokens           int                    `json:"max_tokens"`
	MaxCompletionTokens int                    `json:"max_completion_tokens"`
	Stream              bool                   `json:"stream"`
	AddGenerationPrompt *bool                  `json:"add_generation_prompt"`
}

// completion serves /v1/completions, or /v1/chat/completions when chat
// is set, and writes OpenAI's answer.
func (s *Server) completion(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req completionRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 8<<20)).Decode(&req); err != nil {
			apiError(w, http.StatusBadRequest, fmt.Sprintf("invalid JSON body: %v", err))
			return
		}
		if req.Model != s.cfg.Model {
			apiError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
			return
		}
		if req.Stream {
			apiError(w, http.StatusBadRequest, "stream is not supported by the simulated engine")
			return
		}
		n := req.MaxTokens
		if req.MaxCompletionTokens > 0 {
			n = req.MaxCompletionTokens
		}
		if n <= 0 {
			n = 16 // OpenAI's and vLLM's default for completions
		}
		if n > maxTokens {
			apiError(w, http.StatusBadRequest, fmt.Sprintf("max_tokens %d is more than the %d allowed", n, maxTokens))
			return
		}
		var segs []workload.Segment
		choice := map[string]any{"index": 0, "finish_reason": "length"}
		text := strings.Repeat(" sim", n)
		object := "text_completion"
		if chat {
			if len(req.Messages) == 0 {
				apiError(w, http.StatusBadRequest, "messages must not be empty")
				return
			}
			msgs := make([]tokenize.Message, len(req.Messages))
			for i := range req.Messages {
				content, err := req.Messages[i].Text()
				if err != nil || req.Messages[i].Role == "" {
					apiError(w, http.StatusBadRequest, fmt.Sprintf("messages[%d]: a role and text content are required", i))
					return
				}
				msgs[i] = tokenize.Message{Role: req.Messages[i].Role, Content: content}
			}
			segs = standin.ChatPieces(msgs, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
			object, choice["message"] = "chat.completion", map[string]string{"role": "assistant", "content": text}
		} else {
			var prompt string
			switch p := req.Prompt.(type) {
			case string:
				prompt = p
			case []any:
				if len(p) == 1 {
					prompt, _ = p[0].(string)
				}
			}
			if prompt == "" {
				apiError(w, http.StatusBadRequest, "prompt must be one non-empty string")
				return
			}
			segs, choice["text"] = standin.Pieces(prompt, true), text
		}
		prompt, cached, err := s.serve(r.Context(), segs, n)
		switch {
		case errors.Is(err, ErrBadRequest):
			apiError(w, http.StatusBadRequest, err.Error())
			return
		case err != nil:
			apiError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		u := usage{PromptTokens: prompt, CompletionTokens: n, TotalTokens: prompt + n}
		u.PromptTokensDetails.CachedTokens = cached
		writeJSON(w, http.StatusOK, map[string]any{
			"id": fmt.Sprintf("cmpl-%s-%d", s.cfg.Pod, time.Now().UnixNano()), "object": object, "created": time.Now().Unix(),
			"model": req.Model, "choices": []any{choice}, "usage": u,
		})
	}
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{
		map[string]any{"id": s.cfg.Model, "object": "model", "owned_by": "vllm", "max_model_len": s.cfg.Engine.CacheBlocks * s.cfg.Engine.BlockSize},
	}})
}

// apiError writes vLLM's error body.
func apiError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": http.StatusText(code), "code": code}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// registerMetrics exports the engine under vLLM's metric names, labelled
// model_name and engine as vLLM v1 labels them.
func (s *Server) registerMetrics(reg *prometheus.Registry) {
	labels := prometheus.Labels{"model_name": s.cfg.Model, "engine": "0"}
	read := func(f func() float64) func() float64 {
		return func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return f()
		}
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, read(f))
	}
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, read(f))
	}
	reg.MustRegister(
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.", func() float64 { return float64(s.eng.Load().Running) }),
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func() float64 { return float64(s.eng.Load().Waiting) }),
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func() float64 { return s.eng.Load().KVUsage }),
		counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", func() float64 { return float64(s.queries) }),
		counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", func() float64 { return float64(s.hits) }),
		counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", func() float64 { return float64(s.promptToks) }),
		counter("vllm:generation_tokens_total", "Number of generation tokens processed.", func() float64 { return float64(s.genToks) }),
		counter("vllm:request_success_total", "Count of successfully processed requests.", func() float64 { return float64(s.success) }),
		counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", func() float64 { return float64(s.eng.Stats().Preemptions) }),
		// Not vLLM's: what the image test (scripts/image-test.sh) checks the
		// replicas' resident blocks against.
		gauge("kvsim_cached_blocks", "Blocks the simulated engine's prefix cache holds.", func() float64 { return float64(s.eng.CachedBlocks()) }),
	)
}
