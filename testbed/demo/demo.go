// Package demo runs kvindex end to end on one machine: the real daemon (the
// same code as `kvindex serve`, on a configuration built here), simulated
// vLLM engines that publish real KV events over ZeroMQ in vLLM's wire
// format, and a router that asks the daemon over gRPC. It prints what each
// worker holds and what each prompt matched, then stops.
//
// Run is not safe to call twice at once on the same ports; it picks free
// loopback ports itself.
package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/daemon"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/netutil"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// Options tune the demo.
type Options struct {
	// Verbose shows the daemon's logs on stderr.
	Verbose bool
}

const (
	model     = "demo/llama-3.1-8b"
	blockSize = 16
	lora      = "sql-adapter"
)

// Run runs the demo, writing its report to w. It returns an error if any
// answer differs from what the scenario expects, so it doubles as a smoke test.
func Run(ctx context.Context, w io.Writer, opts Options) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	r, stop, err := start(ctx, w, opts)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(w, "kvindex demo: daemon on %s (gRPC), metrics on http://%s/metrics\n", r.d.GRPCAddr(), r.d.MetricsAddr())
	fmt.Fprintf(w, "4 simulated vLLM workers (vllm-a, vllm-b with 2 DP ranks, vllm-c) publish KV events over ZMQ; model %s, %d-token blocks\n\n", model, blockSize)
	r.scenario()
	if r.err != nil {
		return r.err
	}
	fmt.Fprintf(w, "demo finished: every answer matched the scenario. Try `kvindex serve` and `kvindexctl` next (see README).\n")
	return nil
}

// start binds the simulated engines (first, as vLLM's publishers do),
// starts the daemon on a configuration of free loopback ports, waits until
// it has subscribed to every engine and dials it; stop undoes all of it.
func start(ctx context.Context, w io.Writer, opts Options) (r *run, stop func(), err error) {
	var closers []func()
	stop = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	base, err := netutil.FreePorts(4)
	if err != nil {
		return nil, nil, err
	}
	endpoint := func(port int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", port) }
	cfg := &config.Config{
		GRPCListen:    "127.0.0.1:0",
		MetricsListen: "127.0.0.1:0",
		Models:        []config.Model{{Name: model, BlockSize: blockSize}},
		Pods: []config.Pod{
			{Name: "vllm-a", Model: model, Endpoint: endpoint(base)},
			{Name: "vllm-b", Model: model, Endpoint: endpoint(base + 1), DPSize: 2},
			{Name: "vllm-c", Model: model, Endpoint: endpoint(base + 3)},
		},
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, nil, fmt.Errorf("demo: config: %w", err)
	}
	log := slog.New(slog.DiscardHandler)
	if opts.Verbose {
		log = daemon.NewLogger(cfg.Log, os.Stderr)
	}
	r = &run{ctx: ctx, w: w, engines: map[string]*engine{}}
	for i, ref := range []events.WorkerRef{{Pod: "vllm-a"}, {Pod: "vllm-b"}, {Pod: "vllm-b", DPRank: 1}, {Pod: "vllm-c"}} {
		name := ref.String()
		pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{
			Endpoint: endpoint(base + i),
			Topic:    "kv@" + name + "@" + model,
			Encoding: events.EncodeOptions{Encoding: events.EncodingMap},
			Bind:     true,
		})
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func() { pub.Close() })
		r.engines[name] = &engine{name: name, ref: ref, pub: pub, hashBase: uint64(i+1) << 40}
	}
	if r.d, err = daemon.New(cfg, log); err != nil {
		return nil, nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.d.Run(runCtx) }()
	closers = append(closers, func() { cancel(); <-done })
	for _, e := range r.engines {
		if err := e.pub.WaitForSubscribers(ctx, 1); err != nil {
			return nil, nil, fmt.Errorf("demo: %s: %w", e.name, err)
		}
	}
	if r.c, err = api.Dial(ctx, r.d.GRPCAddr()); err != nil {
		return nil, nil, err
	}
	closers = append(closers, func() { r.c.Close() })
	return r, stop, nil
}

// scenario plays the demo's story and checks every answer; the first
// failure ends it, in r.err.
func (r *run) scenario() {
	system := tokens("You are a helpful assistant. Answer precisely.", 32*blockSize) // a 512-token system prompt
	q1 := tokens("How do I reverse a linked list?", 6*blockSize+7)
	q2 := tokens("Write a SQL query for monthly revenue.", 4*blockSize)
	q3 := tokens("Explain the CAP theorem.", 5*blockSize)

	r.step("Engines cache prompts they served (BlockStored):")
	a := r.engines["vllm-a/0"]
	sysA := a.store(r, nil, system, "") // system prompt ...
	a.store(r, sysA, q1, "")            // ... then the conversation, chained by parent hash
	r.engines["vllm-b/0"].store(r, nil, system, "")
	r.engines["vllm-b/1"].store(r, nil, append(append([]uint32{}, system...), q2...), lora)
	r.engines["vllm-c/0"].store(r, nil, q3, "")
	if r.err == nil {
		fmt.Fprintln(r.w)
	}
	r.workers()

	prompt1 := append(append(append([]uint32{}, system...), q1...), tokens("And in Go?", 20)...)
	prompt2 := append(append([]uint32{}, system...), q3...)
	prompt3 := append(append([]uint32{}, system...), q2...)
	r.score("follow-up in vllm-a's conversation", &kvindexv1.ScoreRequest{Model: model, TokenIds: prompt1},
		map[string]int{"vllm-a/0": 38, "vllm-b/0": 32})
	r.score("new question after the shared system prompt", &kvindexv1.ScoreRequest{Model: model, TokenIds: prompt2},
		map[string]int{"vllm-a/0": 32, "vllm-b/0": 32})
	r.score("the SQL prompt on the sql-adapter LoRA", &kvindexv1.ScoreRequest{Model: model, TokenIds: prompt3, LoraName: lora},
		map[string]int{"vllm-b/1": 36})
	r.score("the same SQL prompt on the base model (LoRA blocks never match it)", &kvindexv1.ScoreRequest{Model: model, TokenIds: prompt3},
		map[string]int{"vllm-a/0": 32, "vllm-b/0": 32})

	r.step("vllm-a evicts block 10 of the system prompt (BlockRemoved):")
	a.remove(r, a.hashes[10])
	r.score("the follow-up again: vllm-a's prefix now stops at block 10", &kvindexv1.ScoreRequest{Model: model, TokenIds: prompt1},
		map[string]int{"vllm-a/0": 10, "vllm-b/0": 32})

	r.step("vllm-b rank 0 restarts (its seq starts again at 0) and caches a different prompt:")
	b0 := r.engines["vllm-b/0"]
	b0.pub.SetSeq(0)
	b0.store(r, nil, q3, "")
	r.score("the follow-up: the restarted worker's old blocks are gone", &kvindexv1.ScoreRequest{Model: model, TokenIds: prompt1},
		map[string]int{"vllm-a/0": 10})
	r.step("vllm-c resets its prefix cache (AllBlocksCleared):")
	r.engines["vllm-c/0"].publish(r, events.Event{Kind: events.KindAllBlocksCleared})
	r.score("q3 alone: only the restarted vllm-b/0 holds it now", &kvindexv1.ScoreRequest{Model: model, TokenIds: q3},
		map[string]int{"vllm-b/0": 5})
	r.workers()
}

// run carries the demo's state between steps.
type run struct {
	ctx     context.Context
	w       io.Writer
	d       *daemon.Daemon
	c       *api.Client
	engines map[string]*engine
	err     error
}

func (r *run) step(s string) {
	if r.err == nil {
		fmt.Fprintf(r.w, "== %s\n", s)
	}
}

// workers prints ListWorkers as a table.
func (r *run) workers() {
	if r.err != nil {
		return
	}
	resp, err := r.c.ListWorkers(r.ctx, &kvindexv1.ListWorkersRequest{})
	if err != nil {
		r.err = fmt.Errorf("demo: ListWorkers: %w", err)
		return
	}
	fmt.Fprintf(r.w, "\nWorkers (ListWorkers over gRPC, as `kvindexctl workers` shows them):\n")
	tw := tabwriter.NewWriter(r.w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  WORKER\tLAST SEQ\tRESIDENT BLOCKS\tSTORED\tREMOVED\tRESTARTS\tCLEARS\tGAPS\tERRORS")
	for _, ws := range resp.GetWorkers() {
		fmt.Fprintf(tw, "  %s/%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", ws.GetWorker().GetPod(), ws.GetWorker().GetDpRank(),
			ws.GetLastSeq(), ws.GetResidentBlocks(), ws.GetBlocksStored(), ws.GetBlocksRemoved(), ws.GetRestarts(), ws.GetClears(),
			ws.GetGaps(), ws.GetDecodeErrors()+ws.GetApplyErrors())
	}
	tw.Flush()
	fmt.Fprintln(r.w)
}

// score asks the daemon, prints the answer and checks it against want
// (worker -> matched blocks; absent workers must not match).
func (r *run) score(title string, req *kvindexv1.ScoreRequest, want map[string]int) {
	if r.err == nil {
		r.err = r.checkScore(title, req, want)
	}
}

func (r *run) checkScore(title string, req *kvindexv1.ScoreRequest, want map[string]int) error {
	resp, err := r.c.Score(r.ctx, req)
	if err != nil {
		return fmt.Errorf("demo: Score %q: %w", title, err)
	}
	extra := ""
	if req.LoraName != "" {
		extra = ", LoRA " + req.LoraName
	}
	fmt.Fprintf(r.w, "Score: %s (%d tokens = %d full blocks%s)\n", title, len(req.TokenIds), resp.GetPromptBlocks(), extra)
	tw := tabwriter.NewWriter(r.w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  WORKER\tMATCHED BLOCKS\tMATCHED TOKENS\tOF PROMPT")
	got := map[string]int{}
	for _, ws := range resp.GetWorkers() {
		name := fmt.Sprintf("%s/%d", ws.GetWorker().GetPod(), ws.GetWorker().GetDpRank())
		got[name] = int(ws.GetMatchedBlocks())
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%.0f%%\n", name, ws.GetMatchedBlocks(), ws.GetMatchedTokens(),
			100*float64(ws.GetMatchedTokens())/float64(max(1, len(req.TokenIds))))
	}
	if len(resp.GetWorkers()) == 0 {
		fmt.Fprintln(tw, "  (no worker holds any of it)\t\t\t")
	}
	tw.Flush()
	if len(resp.GetWorkers()) > 0 {
		fmt.Fprintf(r.w, "  -> route to %s/%d\n", resp.GetWorkers()[0].GetWorker().GetPod(), resp.GetWorkers()[0].GetWorker().GetDpRank())
	}
	fmt.Fprintln(r.w)
	for name, n := range want {
		if got[name] != n {
			return fmt.Errorf("demo: %q: %s matched %d blocks, want %d", title, name, got[name], n)
		}
	}
	for name, n := range got {
		if _, ok := want[name]; !ok {
			return fmt.Errorf("demo: %q: %s matched %d blocks, want none", title, name, n)
		}
	}
	return nil
}

// engine is a minimal simulated vLLM engine: it hands out block hashes and
// publishes the events its prefix cache would.
type engine struct {
	name     string
	ref      events.WorkerRef
	pub      *enginepub.Publisher
	hashBase uint64
	hashes   []uint64 // every block hash it stored, in order
}

// store announces the full blocks of toks chained after parent (nil for the
// start of a sequence) and returns the new blocks' hashes.
func (e *engine) store(r *run, parent []uint64, toks []uint32, loraName string) []uint64 {
	if r.err != nil {
		return nil
	}
	n := len(toks) / blockSize
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = e.hashBase + uint64(len(e.hashes)) + 1
		e.hashes = append(e.hashes, hs[i])
	}
	ev := events.Event{Kind: events.KindBlockStored, BlockHashes: hs, TokenIDs: toks[:n*blockSize], BlockSize: blockSize, MediumName: "GPU"}
	if len(parent) > 0 {
		ev.ParentHash, ev.HasParent = parent[len(parent)-1], true
	}
	if loraName != "" {
		ev.LoRAName = loraName
		ev.ExtraKeys = make([]events.ExtraKeys, n)
		for i := range ev.ExtraKeys {
			ev.ExtraKeys[i] = events.AppendString(events.AppendTuple(nil, 1), loraName)
		}
	}
	e.publish(r, ev)
	fmt.Fprintf(r.w, "  %-9s BlockStored   %3d blocks (%d tokens)%s\n", e.name, n, n*blockSize, map[bool]string{true: " on LoRA " + loraName}[loraName != ""])
	return hs
}

func (e *engine) remove(r *run, hashes ...uint64) {
	if r.err != nil {
		return
	}
	e.publish(r, events.Event{Kind: events.KindBlockRemoved, BlockHashes: hashes, MediumName: "GPU"})
	fmt.Fprintf(r.w, "  %-9s BlockRemoved  %3d block(s)\n\n", e.name, len(hashes))
}

// publish sends one batch and waits until the daemon has processed it.
func (e *engine) publish(r *run, evs ...events.Event) {
	if r.err != nil {
		return
	}
	before := r.received(e.ref)
	seq, err := e.pub.Publish(&events.Batch{Timestamp: float64(time.Now().UnixNano()) / 1e9, Events: evs, DPRank: e.ref.DPRank, HasDPRank: true})
	if err != nil {
		r.err = err
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if r.received(e.ref) > before {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	r.err = fmt.Errorf("demo: %s: the daemon never received seq %d", e.name, seq)
}

// received counts the messages the daemon has processed from a worker.
func (r *run) received(ref events.WorkerRef) int64 {
	for _, s := range r.d.Subscriber().WorkerStats() {
		if s.Worker == ref {
			return s.Batches + s.DecodeErrors
		}
	}
	return 0
}

// tokens returns n deterministic token ids for a text (a stand-in tokenizer).
func tokens(text string, n int) []uint32 {
	var h uint32 = 2166136261
	for i := 0; i < len(text); i++ {
		h = (h ^ uint32(text[i])) * 16777619
	}
	out := make([]uint32, n)
	for i := range out {
		h = h*1664525 + 1013904223
		out[i] = h % 128000
	}
	return out
}
