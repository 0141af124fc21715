package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/testbed/sim/demoload"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/vllmsim"
)

func newEngine() *cobra.Command {
	cfg := vllmsim.Config{Engine: engine.Config{Time: engine.DefaultTimeModel()}}
	var logFormat string
	cmd := &cobra.Command{
		Use:   "engine",
		Short: "Serve one simulated vLLM engine: KV events over ZeroMQ, /metrics, an OpenAI-compatible API",
		Long: "engine runs one simulated vLLM engine on the wall clock, as `vllm serve` with\n" +
			"--kv-events-config would: KV events in vLLM's wire format on a ZeroMQ PUB socket with a\n" +
			"replay ROUTER socket, /metrics under vLLM's metric names, and /v1/completions,\n" +
			"/v1/chat/completions, /v1/models and /health. Requests fill and evict its cache.",
		Example: "  kvsim engine --model meta-llama/Llama-3.1-8B-Instruct --pod vllm-0 --http :8000",
		Args:    cobra.NoArgs,
		RunE: interruptible(func(ctx context.Context, _ io.Writer, _ []string) error {
			if cfg.Pod == "" {
				host, err := os.Hostname()
				if err != nil {
					return fmt.Errorf("engine: --pod not given and no hostname: %w", err)
				}
				cfg.Pod = host
			}
			cfg.Logger = newLogger(logFormat)
			s, err := vllmsim.New(cfg)
			if err != nil {
				return err
			}
			return s.Run(ctx)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Model, "model", "meta-llama/Llama-3.1-8B-Instruct", "served model name")
	f.StringVar(&cfg.Pod, "pod", "", "pod name in the event topic kv@<pod>@<model> (default: the hostname)")
	f.StringVar(&cfg.Publish, "publish", "tcp://*:5557", "KV event PUB endpoint (vLLM's endpoint)")
	f.StringVar(&cfg.Replay, "replay", "tcp://*:5567", "replay ROUTER endpoint (vLLM's replay_endpoint; empty for none)")
	f.StringVar(&cfg.HTTPListen, "http", ":8000", "OpenAI API and /metrics listen address")
	f.IntVar(&cfg.Engine.BlockSize, "block-size", 16, "tokens per KV block (vLLM's --block-size)")
	f.IntVar(&cfg.Engine.CacheBlocks, "cache-blocks", 8000, "KV cache in blocks (vLLM's num_gpu_blocks)")
	f.Float64Var(&cfg.Engine.Time.PrefillTokensPerSec, "prefill-rate", cfg.Engine.Time.PrefillTokensPerSec, "prefill tokens per second")
	f.Uint64Var(&cfg.Engine.HashSeed, "hash-seed", 0, "seed of the engine's block hashes (vLLM's PYTHONHASHSEED)")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}

func newLoad() *cobra.Command {
	var (
		cfg       demoload.Config
		kvAddrs   []string
		engines   []string
		logFormat string
		metrics   string
	)
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Send chat requests routed by kvindex to OpenAI-compatible engines (the compose demo's load)",
		Long: "load sends chat requests that share a few long system prompts: each is routed by kvindex's\n" +
			"Route (replicas asked in turn), posted to the chosen engine's /v1/chat/completions and\n" +
			"released. Without a kvindex answer it falls back to round-robin. Prompts are tokenized as\n" +
			"`kvsim engine` tokenizes them, so kvindex sees the tokens the engines' events carry.",
		Example: "  kvsim load --kvindex replica-0:50051 --kvindex replica-1:50051 \\\n" +
			"    --engine engine-0=http://engine-0:8000 --engine engine-1=http://engine-1:8000 --rate 4",
		Args: cobra.NoArgs,
		RunE: interruptible(func(ctx context.Context, w io.Writer, _ []string) error {
			cfg.Engines = map[string]string{}
			for _, e := range engines {
				pod, url, ok := strings.Cut(e, "=")
				if !ok || pod == "" || !strings.HasPrefix(url, "http") {
					return fmt.Errorf("load: --engine %q: want pod=http://host:port", e)
				}
				cfg.Engines[pod] = url
			}
			if len(kvAddrs) == 0 {
				return errors.New("load: --kvindex is required")
			}
			var kvs []*api.Client
			for _, a := range kvAddrs {
				c, err := api.Dial(ctx, a)
				if err != nil {
					return err
				}
				defer c.Close()
				kvs = append(kvs, c)
			}
			cfg.Logger = newLogger(logFormat)
			d, err := demoload.New(cfg, kvs...)
			if err != nil {
				return err
			}
			if metrics != "" {
				lis, err := net.Listen("tcp", metrics)
				if err != nil {
					return fmt.Errorf("load: metrics listen on %s: %w", metrics, err)
				}
				reg := prometheus.NewRegistry()
				reg.MustRegister(d.Collector())
				mux := http.NewServeMux()
				mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
				mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
				srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
				go func() { _ = srv.Serve(lis) }()
				defer srv.Close()
			}
			err = d.Run(ctx)
			st := d.Stats()
			fmt.Fprintf(w, "sent %d, failed %d, dropped %d; routed by kvindex %d, round-robin %d; prompt tokens cached %.1f%%\n",
				st.Sent.Load(), st.Failed.Load(), st.Dropped.Load(), st.Routed.Load(), st.Fallback.Load(), 100*st.HitRate())
			return err
		}),
	}
	f := cmd.Flags()
	f.StringArrayVar(&kvAddrs, "kvindex", nil, "kvindex gRPC address (repeatable: replicas asked in turn)")
	f.StringArrayVar(&engines, "engine", nil, "pod=http://host:port of an engine (repeatable)")
	f.StringVar(&cfg.Model, "model", "meta-llama/Llama-3.1-8B-Instruct", "model requests name")
	f.Float64Var(&cfg.Rate, "rate", 4, "mean arrivals per second (Poisson)")
	f.IntVar(&cfg.Prefixes, "prefixes", 12, "distinct system prompts")
	f.Float64Var(&cfg.Zipf, "zipf", 1.1, "popularity exponent of the system prompts")
	f.IntVar(&cfg.SystemTokens, "system-tokens", 1024, "system prompt length in tokens")
	f.DurationVar(&cfg.Duration, "duration", 0, "stop after this long (0: until interrupted)")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of arrivals and prompt choices")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	f.StringVar(&metrics, "metrics-listen", "", "serve the load's counters on /metrics and /healthz here (e.g. :9500)")
	return cmd
}

// newLogger logs to stderr at info level in format (text or json).
func newLogger(format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}
