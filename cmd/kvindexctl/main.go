// Command kvindexctl is kvindex's operator CLI: workers and their health,
// how a prompt scores, and the index itself (lookup, dump, diff, diagnose,
// watch, top, health); `kvindexctl --help` lists commands and flags. The
// logic lives in ctl; this file only wires flags to it.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes kvindexctl with args and returns the process exit code:
// 0 on success, 1 on any error (printed to stderr with the server's gRPC
// code and message).
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(stdin)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "kvindexctl:", err)
		return 1
	}
	return 0
}

func newRoot(stdin io.Reader) *cobra.Command {
	cfg := ctl.Config{Stdin: stdin}
	root := &cobra.Command{
		Use:           "kvindexctl",
		Short:         "Inspect a kvindex server: its workers, how it scores a prompt, and why a prompt misses",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&cfg.Addr, "addr", ctl.DefaultAddr, "kvindex gRPC address (host:port)")
	pf.DurationVar(&cfg.Timeout, "timeout", 10*time.Second, "deadline for the call (0 for none)")
	pf.BoolVar(&cfg.JSON, "json", false, "print the server's answer as protojson")
	pf.BoolVar(&cfg.TLS.On, "tls", false, "connect over TLS (implied by --tls-ca and --tls-cert)")
	pf.StringVar(&cfg.TLS.CAFile, "tls-ca", "", "PEM bundle that signs the server's certificate (default: system roots)")
	pf.StringVar(&cfg.TLS.CertFile, "tls-cert", "", "client certificate, for a server that requires one (mTLS)")
	pf.StringVar(&cfg.TLS.KeyFile, "tls-key", "", "client certificate's key")
	pf.StringVar(&cfg.TLS.ServerName, "tls-server-name", "", "name to check the server's certificate against (default: the host of --addr)")
	var tokenFile string
	pf.StringVar(&tokenFile, "token-file", "", "file holding a bearer token (default: $KVINDEX_TOKEN)")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if tokenFile == "" {
			cfg.Token = os.Getenv("KVINDEX_TOKEN")
			return nil
		}
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return fmt.Errorf("token: %w", err)
		}
		cfg.Token = strings.TrimRight(string(b), "\r\n")
		return nil
	}
	root.AddCommand(newWorkers(&cfg), newScore(&cfg), newLookup(&cfg), newDump(&cfg), newDiff(&cfg), newDiagnose(&cfg), newWatch(&cfg), newTop(&cfg), newHealth(&cfg))
	return root
}

// command builds a subcommand that takes no positional arguments and runs
// f with *a (bound to its flags) on a copy of cfg writing to the command's
// output.
func command[A any](cfg *ctl.Config, use, short, example string, f func(context.Context, ctl.Config, A) error, a *A) *cobra.Command {
	return &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := *cfg
			c.Out = cmd.OutOrStdout()
			return f(cmd.Context(), c, *a)
		},
	}
}

func newWorkers(cfg *ctl.Config) *cobra.Command {
	var model string
	cmd := command(cfg, "workers", "List workers with their event-stream and index health", "", ctl.Workers, &model)
	cmd.Flags().StringVar(&model, "model", "", "list only the workers of this model")
	return cmd
}

func newScore(cfg *ctl.Config) *cobra.Command {
	var a ctl.ScoreArgs
	cmd := command(cfg, "score", "Show how long a prefix of a prompt each worker holds",
		"  kvindexctl score --model llama --tokens 1,2,3,4\n"+
			"  kvindexctl score --model llama --tokens-file prompt.json --worker pod-a/0 --worker pod-b/0\n"+
			"  tokenize < prompt.txt | kvindexctl score --model llama --tokens-file -\n"+
			"  kvindexctl score --model llama --tokens-file prompt.json --explain --policy cache_aware\n"+
			"  kvindexctl score --model llama --prompt 'Once upon a time'    # tokenized by the model's vLLM server\n"+
			"  kvindexctl score --model llama --messages-file chat.json --explain",
		ctl.Score, &a)
	promptFlags(cmd, &a.PromptArgs)
	f := cmd.Flags()
	f.StringArrayVar(&a.Workers, "worker", nil, "candidate worker pod/rank (repeatable); every candidate is listed")
	f.BoolVar(&a.Explain, "explain", false, "show the ranking breakdown per worker (overlap, load, penalty, score, reason)")
	f.StringVar(&a.Policy, "policy", "", "ranking policy: cache_aware or longest_prefix (ranks every worker of the model)")
	f.StringVar(&a.Guard, "guard", "", "hotspot guard of cache_aware: cost, static or off")
	return cmd
}

// promptFlags adds the prompt flags score, lookup and diagnose share.
func promptFlags(cmd *cobra.Command, a *ctl.PromptArgs) {
	f := cmd.Flags()
	f.StringVar(&a.Model, "model", "", "served model name (required)")
	f.StringVar(&a.Tokens, "tokens", "", "prompt token ids, comma or space separated")
	f.StringVar(&a.TokensFile, "tokens-file", "", "file of token ids (separated, or a JSON array); - for stdin")
	f.StringVar(&a.Prompt, "prompt", "", "the prompt as text, tokenized by the server through the model's vLLM server")
	f.StringVar(&a.MessagesFile, "messages-file", "", "file of a chat as a JSON array of {role, content} (an OpenAI messages list), tokenized by the server; - for stdin")
	f.StringVar(&a.LoRA, "lora", "", "LoRA adapter name")
	f.StringVar(&a.CacheSalt, "cache-salt", "", "request cache_salt")
	_ = cmd.MarkFlagRequired("model")
}

func newLookup(cfg *ctl.Config) *cobra.Command {
	var a ctl.PromptArgs
	cmd := command(cfg, "lookup", "Show which workers hold each block of a prompt, in which media",
		"  kvindexctl lookup --model llama --tokens-file prompt.json", ctl.Lookup, &a)
	promptFlags(cmd, &a)
	return cmd
}

func newDump(cfg *ctl.Config) *cobra.Command {
	var a ctl.DumpArgs
	cmd := command(cfg, "dump", "List a worker's resident content keys and its digest",
		"  kvindexctl dump --worker pod-a/0\n  kvindexctl dump --worker pod-a/0 --max-keys 100 --json", ctl.Dump, &a)
	f := cmd.Flags()
	f.StringVar(&a.Worker, "worker", "", "worker pod/rank (required)")
	f.Uint32Var(&a.PageSize, "page-size", 0, "keys per call (default: the server's, 1000; at most 10000)")
	f.IntVar(&a.MaxKeys, "max-keys", 0, "stop after this many keys (0: all)")
	_ = cmd.MarkFlagRequired("worker")
	return cmd
}

func newDiff(cfg *ctl.Config) *cobra.Command {
	var a ctl.DiffArgs
	cmd := command(cfg, "diff", "Compare two servers' workers: by digest, then block by block where they differ",
		"  kvindexctl diff --addr replica-0:50051 --other replica-1:50051\n"+
			"  kvindexctl diff --addr replica-0:50051 --other replica-1:50051 --worker pod-a/0 --json",
		ctl.Diff, &a)
	f := cmd.Flags()
	f.StringVar(&a.Other, "other", "", "the second server's address (required; the first is --addr)")
	f.StringVar(&a.Worker, "worker", "", "compare only this worker pod/rank")
	f.StringVar(&a.Model, "model", "", "compare only this model's workers")
	f.Uint32Var(&a.PageSize, "page-size", 0, "keys per dump call")
	f.IntVar(&a.MaxShown, "max-shown", 20, "keys listed per side and worker")
	_ = cmd.MarkFlagRequired("other")
	return cmd
}

func newDiagnose(cfg *ctl.Config) *cobra.Command {
	var a ctl.DiagnoseArgs
	cmd := command(cfg, "diagnose", "Explain why a worker misses a prompt, and check parity with the engine's block hashes",
		"  kvindexctl diagnose --model llama --tokens-file prompt.json --worker pod-a/0\n"+
			"  kvindexctl diagnose --model llama --tokens-file prompt.json --worker pod-a/0 --engine-hashes 0x1a2b,0x3c4d",
		ctl.Diagnose, &a)
	promptFlags(cmd, &a.PromptArgs)
	f := cmd.Flags()
	f.StringVar(&a.Worker, "worker", "", "the worker expected to hold the prompt, pod/rank (required)")
	f.StringVar(&a.EngineHashes, "engine-hashes", "", "the engine's block hashes for the prompt (as its BlockStored events carry them), for the parity check")
	_ = cmd.MarkFlagRequired("worker")
	return cmd
}

func newWatch(cfg *ctl.Config) *cobra.Command {
	var a ctl.WatchArgs
	cmd := command(cfg, "watch", "Stream the events the index applies, as they are applied",
		"  kvindexctl watch --worker pod-a/0\n  kvindexctl watch --model llama --kind reset --kind cleared --json", ctl.Watch, &a)
	f := cmd.Flags()
	f.StringVar(&a.Model, "model", "", "only this model's workers")
	f.StringArrayVar(&a.Workers, "worker", nil, "only this worker pod/rank (repeatable)")
	f.StringArrayVar(&a.Kinds, "kind", nil, "only this kind: stored, removed, cleared, reset, delta, restored (repeatable)")
	f.Uint32Var(&a.Buffer, "buffer", 0, "events the server queues for this reader before it drops (default 256, at most 4096)")
	f.BoolVar(&a.Hashes, "hashes", false, "show the events' first block hashes")
	f.IntVar(&a.Count, "count", 0, "stop after this many events (0: until interrupted)")
	return cmd
}

func newTop(cfg *ctl.Config) *cobra.Command {
	var a ctl.TopArgs
	cmd := command(cfg, "top", "A live per-worker table: events/s, resident blocks, gaps, replays, staleness, in-flight, predicted hit ratio",
		"  kvindexctl top\n  kvindexctl top --model llama --interval 5s --iterations 1 --json", ctl.Top, &a)
	f := cmd.Flags()
	f.StringVar(&a.Model, "model", "", "only this model's workers")
	f.DurationVar(&a.Interval, "interval", 2*time.Second, "refresh period")
	f.IntVar(&a.Iterations, "iterations", 0, "stop after this many tables (0: until interrupted)")
	f.BoolVar(&a.Clear, "clear", false, "clear the terminal before each table")
	return cmd
}

// healthArgs are kvindexctl health's arguments: a gRPC service, or an HTTP
// URL to check instead.
type healthArgs struct{ service, httpURL string }

func newHealth(cfg *ctl.Config) *cobra.Command {
	var a healthArgs
	health := func(ctx context.Context, c ctl.Config, a healthArgs) error {
		if a.httpURL != "" {
			return ctl.HealthHTTP(ctx, c, a.httpURL)
		}
		return ctl.Health(ctx, c, a.service)
	}
	cmd := command(cfg, "health", "Check the server's gRPC health (grpc.health.v1); exits non-zero unless SERVING",
		"  kvindexctl --addr localhost:50051 health\n  kvindexctl health --http http://127.0.0.1:9400/healthz", health, &a)
	cmd.Long = "health asks the standard gRPC health service, as kubelet's gRPC probe does, and prints the\n" +
		"status; it exits non-zero unless the status is SERVING, so it serves as a container health check.\n" +
		"With --http it GETs that URL instead (a kvindex agent's /healthz: agents serve no gRPC), sending the\n" +
		"--token-file token as \"Authorization: Bearer\" and, for https, the --tls-* settings."
	cmd.Flags().StringVar(&a.service, "service", "", "service to ask about (default: the server as a whole)")
	cmd.Flags().StringVar(&a.httpURL, "http", "", "check this HTTP URL (200 is healthy) instead of gRPC")
	return cmd
}
