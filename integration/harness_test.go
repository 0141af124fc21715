package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/daemon"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/netutil"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

const (
	model     = "test/model"
	blockSize = 16
)

// freePorts returns the first of n consecutive free loopback TCP ports.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	base, err := netutil.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return base
}

// pod is a simulated vLLM pod: one publisher per DP rank.
type pod struct {
	name string
	pubs []*enginepub.Publisher
}

// fleet is a running daemon plus its simulated engines and a gRPC client.
type fleet struct {
	t      *testing.T
	log    *slog.Logger
	d      *daemon.Daemon
	client *api.Client
	pods   map[string]*pod
	// cfg is the daemon's configuration, defaults and checks applied by
	// start.
	cfg    *config.Config
	cancel context.CancelFunc
	done   chan error
	// pushAddr is the daemon's push listener, rank 0's port ("" without
	// push pods); it binds one port per rank of its largest push pod.
	pushAddr string
}

// podSpec describes a simulated pod.
type podSpec struct {
	name   string
	dpSize int
	model  string
	enc    events.EncodeOptions
	// replayFrames, when not zero, gives the pod a replay socket answering
	// in vLLM's 3- or 4-frame form.
	replayFrames int
	// bufferSteps is how many batches the replay socket keeps (vLLM's
	// buffer_steps); 0 means 10,000.
	bufferSteps int
	// push makes the pod connect to the daemon's push listener with topic
	// (default kv@<name>@<model>) instead of binding, rank r to its port
	// plus r as vLLM does.
	push  bool
	topic string
	// capacity and metricsURL set the pull-mode pod's capacity_blocks and
	// metrics_url.
	capacity   int
	metricsURL string
}

// fleetOptions add configuration to a fleet.
type fleetOptions struct {
	// configure, when set, changes the daemon's configuration (events,
	// scoring, ...) once the pods are in it.
	configure func(*config.Config)
	// routes are the push listener's topic routes.
	routes []config.Route
	// log receives the daemon's logs (nil: discarded).
	log *slog.Logger
}

// startFleet starts simulated engines for specs, a daemon subscribed to
// them, and waits until every subscription reached its engine.
func startFleet(t *testing.T, specs ...podSpec) *fleet {
	t.Helper()
	f := newFleet(t, fleetOptions{}, specs...)
	f.start()
	return f
}

// newFleet starts the simulated engines and builds the daemon's
// configuration, without starting the daemon (see start).
func newFleet(t *testing.T, opts fleetOptions, specs ...podSpec) *fleet {
	t.Helper()
	f := &fleet{t: t, pods: map[string]*pod{}, done: make(chan error, 1), log: opts.log}
	cfg := &config.Config{
		GRPCListen:    "127.0.0.1:0",
		MetricsListen: "127.0.0.1:0",
		Models:        []config.Model{{Name: model, BlockSize: blockSize}, {Name: "other/model", BlockSize: blockSize}},
	}
	pushDP := 0 // the push listener's dp_size: its push pods' largest
	for _, s := range specs {
		if s.push {
			pushDP = max(pushDP, s.dpSize, 1)
		}
	}
	if pushDP > 0 {
		f.pushAddr = fmt.Sprintf("tcp://127.0.0.1:%d", freePorts(t, pushDP))
	}
	for _, s := range specs {
		if s.dpSize == 0 {
			s.dpSize = 1
		}
		if s.model == "" {
			s.model = model
		}
		if s.topic == "" {
			s.topic = "kv@" + s.name + "@" + s.model
		}
		base := freePorts(t, s.dpSize)
		replayBase := 0
		if s.replayFrames != 0 {
			replayBase = freePorts(t, s.dpSize)
		}
		p := &pod{name: s.name}
		for r := 0; r < s.dpSize; r++ {
			cfg := enginepub.PublisherConfig{
				Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+r),
				Topic:    s.topic,
				Encoding: s.enc,
				Bind:     true,
			}
			if s.push { // vLLM offsets a connecting endpoint's port by the rank too
				ep, err := events.OffsetEndpoint(f.pushAddr, r)
				if err != nil {
					t.Fatal(err)
				}
				cfg.Endpoint, cfg.Bind = ep, false
			}
			if replayBase != 0 {
				cfg.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", replayBase+r)
				cfg.ReplayFrames = s.replayFrames
				cfg.BufferSteps = s.bufferSteps
			}
			pub, err := enginepub.NewPublisher(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pub.Close() })
			p.pubs = append(p.pubs, pub)
		}
		f.pods[s.name] = p
		if s.push {
			continue
		}
		pc := config.Pod{
			Name:           s.name,
			Model:          s.model,
			Endpoint:       fmt.Sprintf("tcp://127.0.0.1:%d", base),
			DPSize:         s.dpSize,
			MetricsURL:     s.metricsURL,
			CapacityBlocks: s.capacity,
		}
		if replayBase != 0 {
			pc.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", replayBase)
		}
		cfg.Pods = append(cfg.Pods, pc)
	}
	if f.pushAddr != "" {
		cfg.Push = []config.Push{{Listen: f.pushAddr, Routes: opts.routes, DPSize: pushDP}}
	}
	// Admission control sheds calls that queue past its bounds, and lowers
	// the calls it takes on while queueing exceeds its 1 ms target; on a
	// loaded 2-core machine a test's few calls can do both, which would
	// fail a test of something else. Tests of admission set their own.
	cfg.Limits.MaxQueueDelay = 10 * time.Second
	cfg.Limits.QueueTarget = time.Second
	if opts.configure != nil {
		opts.configure(cfg)
	}
	f.cfg = cfg
	return f
}

// start starts the daemon and waits until every engine has its subscriber.
func (f *fleet) start() {
	t := f.t
	t.Helper()
	f.cfg.SetDefaults()
	if err := f.cfg.Validate(); err != nil {
		text, _ := config.Marshal(f.cfg)
		t.Fatalf("config: %v\n%s", err, text)
	}
	var err error
	f.d, err = daemon.New(f.cfg, f.log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go func() { f.done <- f.d.Run(ctx) }()
	t.Cleanup(f.stop)

	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	for _, p := range f.pods {
		for _, pub := range p.pubs {
			if err := pub.WaitForSubscribers(wctx, 1); err != nil {
				t.Fatalf("pod %s: %v", p.name, err)
			}
		}
	}
	f.client, err = api.Dial(wctx, f.d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
}

func (f *fleet) stop() {
	if f.client != nil {
		f.client.Close()
		f.client = nil
	}
	if f.cancel == nil {
		return
	}
	f.cancel()
	f.cancel = nil
	select {
	case err := <-f.done:
		if err != nil {
			f.t.Errorf("daemon stopped with %v", err)
		}
	case <-time.After(10 * time.Second):
		f.t.Errorf("daemon did not stop within 10s")
	}
}

// publish sends events as one batch from pod's rank and waits until the
// daemon has processed it.
func (f *fleet) publish(podName string, rank int, evs ...events.Event) {
	f.t.Helper()
	f.send(podName, rank, func(pub *enginepub.Publisher) (uint64, error) {
		return pub.Publish(&events.Batch{Timestamp: float64(time.Now().UnixNano()) / 1e9, Events: evs, DPRank: rank, HasDPRank: true})
	})
}

// send runs one publishing call for pod's rank and waits until the daemon
// has processed the message it sent (decoded or counted as bad).
func (f *fleet) send(podName string, rank int, do func(*enginepub.Publisher) (uint64, error)) {
	f.t.Helper()
	ref := events.WorkerRef{Pod: podName, DPRank: rank}
	before := f.received(ref)
	seq, err := do(f.pods[podName].pubs[rank])
	if err != nil {
		f.t.Fatal(err)
	}
	f.waitFor(func() bool {
		n, last, ok := f.receivedSeq(ref)
		return n > before && ok && last == seq
	}, fmt.Sprintf("worker %s to process seq %d", ref, seq))
}

// received counts the messages the daemon has processed from a worker.
func (f *fleet) received(ref events.WorkerRef) int64 {
	n, _, _ := f.receivedSeq(ref)
	return n
}

// receivedSeq returns the messages processed from a worker and the last seq.
func (f *fleet) receivedSeq(ref events.WorkerRef) (n int64, last uint64, ok bool) {
	for _, s := range f.d.Subscriber().WorkerStats() {
		if s.Worker == ref {
			return s.Batches + s.DecodeErrors, s.LastSeq, s.HasSeq
		}
	}
	return 0, 0, false
}

// waitFor polls cond for up to 10 s.
func (f *fleet) waitFor(cond func() bool, what string) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	f.t.Fatalf("timed out waiting for %s", what)
}

// status returns a worker's ListWorkers entry.
func (f *fleet) status(podName string, rank int) *kvindexv1.WorkerStatus {
	f.t.Helper()
	resp, err := f.client.ListWorkers(context.Background(), &kvindexv1.ListWorkersRequest{})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, w := range resp.GetWorkers() {
		if w.GetWorker().GetPod() == podName && int(w.GetWorker().GetDpRank()) == rank {
			return w
		}
	}
	f.t.Fatalf("ListWorkers has no %s/%d", podName, rank)
	return nil
}

// score asks the daemon over gRPC.
func (f *fleet) score(req *kvindexv1.ScoreRequest) *kvindexv1.ScoreResponse {
	f.t.Helper()
	if req.Model == "" {
		req.Model = model
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := f.client.Score(ctx, req)
	if err != nil {
		f.t.Fatalf("Score: %v", err)
	}
	return resp
}

// matched returns worker pod/rank's matched blocks (0 when absent) and its
// by-medium split.
func matched(resp *kvindexv1.ScoreResponse, podName string, rank int) (int, map[string]int) {
	for _, w := range resp.GetWorkers() {
		if w.GetWorker().GetPod() == podName && int(w.GetWorker().GetDpRank()) == rank {
			by := map[string]int{}
			for _, m := range w.GetByMedium() {
				by[m.GetMedium()] = int(m.GetBlocks())
				if int(m.GetTokens()) != int(m.GetBlocks())*blockSize {
					panic("medium tokens != blocks * block size")
				}
			}
			if int(w.GetMatchedTokens()) != int(w.GetMatchedBlocks())*blockSize {
				panic("matched tokens != blocks * block size")
			}
			return int(w.GetMatchedBlocks()), by
		}
	}
	return 0, nil
}

// metrics fetches the daemon's /metrics text.
func (f *fleet) metrics() string {
	f.t.Helper()
	resp, err := http.Get("http://" + f.d.MetricsAddr() + "/metrics")
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

// tokens returns n deterministic token ids for a named text.
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

func concat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// engine tracks one simulated engine's block hashes so tests can send
// realistic chained events.
type engine struct {
	next uint64
}

// store builds a BlockStored event for the full blocks of toks after
// parent (0 = none), returning the event and the blocks' engine hashes.
func (e *engine) store(parent uint64, toks []uint32) (events.Event, []uint64) {
	n := len(toks) / blockSize
	hashes := make([]uint64, n)
	for i := range hashes {
		e.next++
		hashes[i] = e.next*0x9e3779b97f4a7c15 | 1<<63 // exercise the uint64 >= 2^63 range
	}
	return events.Event{
		Kind:        events.KindBlockStored,
		BlockHashes: hashes,
		ParentHash:  parent,
		HasParent:   parent != 0,
		TokenIDs:    toks[:n*blockSize],
		BlockSize:   blockSize,
		MediumName:  "GPU",
	}, hashes
}

func removed(hashes ...uint64) events.Event {
	return events.Event{Kind: events.KindBlockRemoved, BlockHashes: hashes, MediumName: "GPU"}
}

var cleared = events.Event{Kind: events.KindAllBlocksCleared}
