package soak

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/enginepub"
	"github.com/kvindex/kvindex/testbed/proc"
)

// Options configure a soak run. DefaultOptions are `make soak`'s.
type Options struct {
	// Duration is how long the fleet runs under load (the warm-up, the
	// final checkpoint and shutdown come on top).
	Duration time.Duration
	// Seed derives every random choice.
	Seed uint64
	// Dir holds the configuration, the daemon binary and the daemon logs.
	Dir string
	// Binary is a prebuilt kvindex; "" builds ./cmd/kvindex with GoTool.
	Binary string
	GoTool string
	// CheckpointEvery is the time between exact checkpoints.
	CheckpointEvery time.Duration
	// ScoreRPS and RouteRPS are the gRPC load's rates.
	ScoreRPS, RouteRPS float64
	// StepInterval is each engine's time between steps.
	StepInterval time.Duration
	// EngineRestartEvery is the time between engine restarts (round
	// robin over the engines); EngineDown how long one stays down.
	EngineRestartEvery time.Duration
	EngineDown         time.Duration
	// DaemonRestarts is how many times the daemon is restarted, SIGTERM
	// and SIGKILL alternately, the last one SIGKILL; all within the first
	// 60% of Duration, so that the last process runs long enough to judge
	// its memory.
	DaemonRestarts int
	// GarbageInterval is the time between hostile probes.
	GarbageInterval time.Duration
	// WarmupSteps is how many steps each engine runs before the daemon
	// first starts, so that it joins engines whose replay buffers no
	// longer reach back to their start.
	WarmupSteps int
	// SampleEvery is the time between RSS and goroutine samples.
	SampleEvery time.Duration
	// MaxRefused is the largest fraction of the load's Score and Route
	// calls the daemon's admission control may refuse for overload
	// (ResourceExhausted, api.IsOverloaded): such a refusal is not a wrong
	// answer, but more of them fail the run (overload_refused).
	MaxRefused float64
	// Engine tunes the simulated engines.
	Engine EngineOptions
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
	// Command is the command line that reproduces the run, for the
	// summary ("" gives one from Duration and Seed).
	Command string
}

// DefaultMaxRefused is Options.MaxRefused's default: on a loaded shared
// host, a CPU stall of more than the daemon's 50 ms queueing budget
// refuses the calls waiting out the stall, a few in a hundred at most.
const DefaultMaxRefused = 0.05

// DefaultOptions are the soak's defaults: two minutes of six engines at
// about 30 steps a second each, 40 Scores and 10 Routes a second, an
// engine restart every 5 s, two daemon restarts, a hostile probe every
// 100 ms and a checkpoint every 5 s.
func DefaultOptions() Options {
	return Options{
		Duration:           2 * time.Minute,
		Seed:               1,
		GoTool:             "go",
		CheckpointEvery:    5 * time.Second,
		ScoreRPS:           40,
		RouteRPS:           10,
		StepInterval:       30 * time.Millisecond,
		EngineRestartEvery: 5 * time.Second,
		EngineDown:         200 * time.Millisecond,
		DaemonRestarts:     2,
		GarbageInterval:    100 * time.Millisecond,
		WarmupSteps:        11_000,
		SampleEvery:        500 * time.Millisecond,
		MaxRefused:         DefaultMaxRefused,
		Engine:             DefaultEngineOptions(),
	}
}

// Validate reports the first option that cannot run, naming it.
func (o *Options) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"duration", o.Duration}, {"checkpoint-every", o.CheckpointEvery}, {"step-interval", o.StepInterval}, {"sample-every", o.SampleEvery}, {"garbage-interval", o.GarbageInterval}} {
		if d.v <= 0 {
			return fmt.Errorf("soak: options: %s %v must be positive", d.name, d.v)
		}
	}
	switch {
	case o.ScoreRPS <= 0 || o.RouteRPS <= 0:
		return fmt.Errorf("soak: options: score-rps %v and route-rps %v must be positive", o.ScoreRPS, o.RouteRPS)
	case !(o.MaxRefused >= 0 && o.MaxRefused <= 1):
		return fmt.Errorf("soak: options: max-refused %v must be in [0, 1]", o.MaxRefused)
	case o.EngineRestartEvery < 0 || o.DaemonRestarts < 0 || o.WarmupSteps < 0:
		return fmt.Errorf("soak: options: engine-restart-every %v, daemon-restarts %d and warmup-steps %d must not be negative", o.EngineRestartEvery, o.DaemonRestarts, o.WarmupSteps)
	case o.Engine.ClearEvery <= 0 || o.Engine.ClearEvery >= o.Engine.BufferSteps:
		return fmt.Errorf("soak: options: engines' clear_every %d must be in (0, buffer steps %d)", o.Engine.ClearEvery, o.Engine.BufferSteps)
	}
	return nil
}

// sample is one reading of the daemon's RSS and goroutines; settled
// says a checkpoint of its process had passed (its join replays were
// over).
type sample struct {
	at         time.Time
	process    int
	settled    bool
	rss        float64
	goroutines float64
}

// runner is one soak run's state.
type runner struct {
	opts    Options
	log     *slog.Logger
	fleet   *Fleet
	engines []*Engine
	byRef   map[events.WorkerRef]*Engine
	models  map[string][]events.WorkerRef
	cfgPath string
	bin     string
	client  *api.Client
	http    *http.Client
	window  Window
	fail    Failures
	load    *Load
	garbage *Garbage

	// chaos serialises engine restarts, daemon restarts and checkpoints.
	chaos sync.Mutex

	mu       sync.Mutex // guards the fields below
	child    *proc.Process
	process  int                      // the current daemon process's number
	restarts map[events.WorkerRef]int // engine restarts during the current process
	// reported is, per worker of the current process, each counter's
	// excess already reported as a failure, so that one failure is
	// reported once and later checkpoints judge what follows it.
	reported map[events.WorkerRef]map[string]uint64
	// flow is, per worker, the blocks its engine had sent and the index
	// had applied at the last checkpoint that compared them.
	flow        map[events.WorkerRef]blockFlow
	listed      map[int]map[listing]bool          // by process: the push workers ListWorkers has shown
	lastWorkers map[int][]*kvindexv1.WorkerStatus // each process's last ListWorkers
	lastMetrics map[int]Metrics                   // each process's last /metrics
	samples     []sample
	settled     map[int]bool    // processes with a passed checkpoint
	cpu         map[int]float64 // each process's last CPU seconds
	terminated  int
	killed      int
	errorLines  int
	aborted     bool

	checkpoints, scoresChecked, comparisons, wrong, residentChecks atomic.Int64
	wrongFiles                                                     atomic.Int64
}

// Run runs a soak with opts and returns its summary. The error reports a
// run that could not be set up or carried out (the daemon would not
// build or start, ports were taken); failures of the daemon under test
// are in the summary (Passed false).
func Run(ctx context.Context, opts Options) (*Summary, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Dir == "" {
		return nil, fmt.Errorf("soak: options: no work directory")
	}
	r := &runner{
		opts: opts, log: opts.Logger, byRef: map[events.WorkerRef]*Engine{},
		http:     &http.Client{Timeout: 3 * time.Second},
		restarts: map[events.WorkerRef]int{}, reported: map[events.WorkerRef]map[string]uint64{}, flow: map[events.WorkerRef]blockFlow{}, listed: map[int]map[listing]bool{},
		lastWorkers: map[int][]*kvindexv1.WorkerStatus{}, lastMetrics: map[int]Metrics{},
		settled: map[int]bool{}, cpu: map[int]float64{},
	}
	start := time.Now()
	loadStart := loadAvg()
	defer r.closeEngines()
	if err := r.setup(ctx); err != nil {
		return nil, err
	}
	if err := r.startDaemon(); err != nil {
		return nil, err
	}
	defer r.killDaemon()
	var err error
	r.client, err = api.Dial(ctx, r.fleet.GRPCAddr(), grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
		MinConnectTimeout: 2 * time.Second,
	}))
	if err != nil {
		return nil, err
	}
	defer r.client.Close()
	if err := r.waitReady(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	r.garbage, err = NewGarbage(r.fleet, opts.Seed, r)
	if err != nil {
		return nil, err
	}
	defer r.garbage.Close()
	r.load = NewLoad(r.client, r.fleet, r.engines, &r.window, r, &r.fail, opts.Seed)

	work, stopWork := context.WithCancel(ctx)
	defer stopWork()
	var wg sync.WaitGroup
	goRun := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(work) }()
	}
	for i, e := range r.engines {
		goRun(func(c context.Context) { r.runEngine(c, e, i) })
	}
	goRun(func(c context.Context) { r.load.RunScores(c, opts.ScoreRPS) })
	goRun(func(c context.Context) { r.load.RunRoutes(c, opts.RouteRPS) })
	goRun(func(c context.Context) { r.garbage.Run(c, opts.GarbageInterval) })
	goRun(r.runSampler)
	goRun(r.runChaos)
	goRun(r.runCheckpoints)
	r.log.Info("soak running", "duration", opts.Duration, "seed", opts.Seed, "engines", len(r.engines), "dir", opts.Dir)

	select {
	case <-time.After(opts.Duration):
	case <-ctx.Done():
	case <-work.Done():
	}
	stopWork()
	wg.Wait()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("soak: interrupted: %w", ctx.Err())
	}
	elapsed := time.Since(start)

	if !r.isAborted() {
		fctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		r.chaos.Lock()
		r.checkpoint(fctx, "final")
		r.chaos.Unlock()
		r.snapshot(fctx)
		cancel()
		r.finalChecks()
		r.stopDaemon(syscall.SIGTERM)
	}
	for _, p := range r.garbage.Problems() {
		r.fail.Add("neighbour_reached", "%s", p)
	}
	sum := r.summary(elapsed, loadStart)
	return sum, nil
}

// setup lays out the fleet, writes the configuration, builds the daemon
// and starts and warms up the engines.
func (r *runner) setup(ctx context.Context) error {
	var err error
	if r.fleet, err = NewFleet(); err != nil {
		return err
	}
	r.models = r.fleet.Workers()
	text, err := r.fleet.YAML()
	if err != nil {
		return err
	}
	r.cfgPath = filepath.Join(r.opts.Dir, "kvindex.yaml")
	if err := os.WriteFile(r.cfgPath, text, 0o644); err != nil {
		return fmt.Errorf("soak: write configuration: %w", err)
	}
	r.bin = r.opts.Binary
	if r.bin == "" {
		r.log.Info("building the daemon", "go", r.opts.GoTool)
		if r.bin, err = proc.Build(ctx, r.opts.GoTool, r.opts.Dir, "github.com/kvindex/kvindex/cmd/kvindex"); err != nil {
			return err
		}
	}
	systems := map[string][][]uint32{}
	for _, m := range []string{ModelA, ModelB} {
		systems[m] = SystemPrompts(r.opts.Seed, m, BlockSizeOf(m), 4)
	}
	for i, spec := range r.fleet.Engines() {
		e, err := NewEngine(spec, r.opts.Engine, r.opts.Seed, i, systems[spec.Model])
		if err != nil {
			return err
		}
		r.engines = append(r.engines, e)
		r.byRef[spec.Worker] = e
	}
	t0 := time.Now()
	for _, e := range r.engines {
		for range r.opts.WarmupSteps {
			if err := e.Step(); err != nil {
				return err
			}
		}
	}
	r.log.Info("engines warmed up", "steps_each", r.opts.WarmupSteps, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

func (r *runner) closeEngines() {
	for _, e := range r.engines {
		_ = e.Close()
	}
}

func (r *runner) currentProcess() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.process
}

func (r *runner) currentChild() (*proc.Process, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.child, r.process
}

// listing is a push worker (rank 0) and the listener that created it.
type listing struct{ pod, endpoint string }

// Process returns the current daemon process's number (DaemonView).
func (r *runner) Process() int { return r.currentProcess() }

// Settled reports whether a checkpoint of daemon process n has passed.
func (r *runner) Settled(n int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.settled[n]
}

// Listed reports whether daemon process n listed pod on the push
// listener at endpoint (DaemonView).
func (r *runner) Listed(n int, pod, endpoint string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.listed[n][listing{pod, endpoint}]
}

func (r *runner) isAborted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.aborted
}

// startDaemon starts the next daemon process and watches it: an exit the
// soak did not ask for is a failure that ends the run.
func (r *runner) startDaemon() error {
	r.mu.Lock()
	n := r.process + 1
	r.mu.Unlock()
	c, err := proc.Start(fmt.Sprintf("daemon process %d", n), exec.Command(r.bin, "serve", "--config", r.cfgPath), r.logPath(n))
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.child, r.process = c, n
	clear(r.restarts)
	clear(r.reported)
	clear(r.flow)
	r.mu.Unlock()
	go func() {
		<-c.Done()
		if c.Stopping() {
			return
		}
		r.fail.Add("daemon_died", "daemon process %d (pid %d) exited by itself: %v; log %s", n, c.Pid(), c.Err(), r.logPath(n))
		r.mu.Lock()
		r.aborted = true
		r.mu.Unlock()
	}()
	r.log.Info("daemon started", "process", n, "pid", c.Pid(), "log", r.logPath(n))
	return nil
}

// logPath is daemon process n's log file.
func (r *runner) logPath(n int) string {
	return filepath.Join(r.opts.Dir, fmt.Sprintf("daemon-%d.log", n))
}

// waitReady waits until the current daemon answers ListWorkers.
func (r *runner) waitReady(ctx context.Context, timeout time.Duration) error {
	c, n := r.currentChild()
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := r.client.ListWorkers(cctx, &kvindexv1.ListWorkersRequest{})
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-c.Done():
			return fmt.Errorf("soak: daemon process %d exited before answering: %v (log %s)", n, c.Err(), r.logPath(n))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("soak: daemon process %d did not answer ListWorkers within %v: %w (log %s)", n, timeout, err, r.logPath(n))
		}
	}
}

// stopDaemon stops the current daemon with sig, checks how it ended and
// scans its log.
func (r *runner) stopDaemon(sig syscall.Signal) {
	c, n := r.currentChild()
	if err := c.Stop(sig, 15*time.Second); err != nil {
		r.fail.Add("daemon_stop", "%v (log %s)", err, r.logPath(n))
	}
	lines, crash, err := ScanLog(r.logPath(n))
	if err != nil {
		r.fail.Add("daemon_log", "%v", err)
	}
	if crash != "" {
		r.fail.Add("daemon_crash", "daemon process %d logged %q (log %s)", n, clip(crash, 200), r.logPath(n))
	}
	r.mu.Lock()
	r.errorLines += lines
	r.mu.Unlock()
}

// killDaemon makes sure no daemon outlives Run.
func (r *runner) killDaemon() {
	c, _ := r.currentChild()
	if c == nil {
		return
	}
	select {
	case <-c.Done():
	default:
		_ = c.Stop(syscall.SIGKILL, 5*time.Second)
	}
}

// runEngine steps engine e every StepInterval, starting at an offset of
// its own.
func (r *runner) runEngine(ctx context.Context, e *Engine, i int) {
	select {
	case <-time.After(time.Duration(i) * r.opts.StepInterval / time.Duration(len(r.engines))):
	case <-ctx.Done():
		return
	}
	t := time.NewTicker(r.opts.StepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := e.Step(); err != nil {
			r.fail.Add("engine_error", "%v", err)
			return
		}
	}
}

// action is one scheduled restart.
type action struct {
	at     time.Duration
	daemon bool
	sig    syscall.Signal
	engine int
}

// schedule returns the run's restarts in time order: DaemonRestarts
// evenly within the first 60% (SIGTERM and SIGKILL alternately, the last
// SIGKILL), and an engine restart every EngineRestartEvery in a seeded
// round-robin order, each engine restarted at most once a round.
func (r *runner) schedule() []action {
	var acts []action
	n := r.opts.DaemonRestarts
	for i := 1; i <= n; i++ {
		sig := syscall.SIGTERM
		if (n-i)%2 == 0 {
			sig = syscall.SIGKILL
		}
		acts = append(acts, action{at: time.Duration(float64(r.opts.Duration) * 0.6 * float64(i) / float64(n+1)), daemon: true, sig: sig})
	}
	if r.opts.EngineRestartEvery > 0 {
		order := rand.New(rand.NewPCG(r.opts.Seed, stringSeed("engine restarts"))).Perm(len(r.engines))
		for k, at := 0, r.opts.EngineRestartEvery; at < r.opts.Duration-r.opts.EngineRestartEvery/2; k, at = k+1, at+r.opts.EngineRestartEvery {
			acts = append(acts, action{at: at + r.opts.EngineRestartEvery/3, engine: order[k%len(order)]})
		}
	}
	sort.SliceStable(acts, func(i, j int) bool { return acts[i].at < acts[j].at })
	return acts
}

func (r *runner) runChaos(ctx context.Context) {
	start := time.Now()
	for _, a := range r.schedule() {
		select {
		case <-time.After(time.Until(start.Add(a.at))):
		case <-ctx.Done():
			return
		}
		r.chaos.Lock()
		if ctx.Err() != nil {
			r.chaos.Unlock()
			return
		}
		if a.daemon {
			r.restartDaemon(ctx, a.sig)
		} else {
			r.restartEngine(ctx, r.engines[a.engine])
		}
		r.chaos.Unlock()
		if r.isAborted() {
			return
		}
	}
}

// restartEngine restarts e once the daemon has applied everything it
// sent (a restart racing a replay is the transport tests' subject; here
// every restart must be seen as exactly one). The caller holds chaos.
func (r *runner) restartEngine(ctx context.Context, e *Engine) {
	ref := e.Spec().Worker
	e.Lock()
	defer e.Unlock()
	// Fewer than this many messages since the last restart could leave
	// the new process's first seq past the old one's last: vLLM's seqs
	// carry no process id, so that would read as a gap, not a restart.
	if e.SinceRestartLocked() < 100 {
		r.log.Info("engine restart skipped: too few messages since the last", "worker", ref.String())
		return
	}
	if err := e.FlushLocked(); err != nil {
		r.fail.Add("engine_error", "%v", err)
		return
	}
	seq, _ := e.LastSeqLocked()
	if _, err := r.waitApplied(ctx, map[events.WorkerRef]uint64{ref: seq}, 30*time.Second); err != nil {
		if ctx.Err() == nil {
			r.fail.Add("not_applied", "before restarting engine %s: %v", ref, err)
		}
		return
	}
	if err := e.RestartLocked(ctx, r.opts.EngineDown); err != nil {
		if ctx.Err() == nil {
			r.fail.Add("engine_restart", "%v", err)
		}
		return
	}
	r.mu.Lock()
	r.restarts[ref]++
	r.mu.Unlock()
	r.log.Info("engine restarted", "worker", ref.String())
}

// restartDaemon stops the daemon with sig and starts it again with the
// same configuration. The caller holds chaos.
func (r *runner) restartDaemon(ctx context.Context, sig syscall.Signal) {
	r.window.Begin()
	ended := false
	end := func() {
		if !ended {
			r.window.End()
			ended = true
		}
	}
	defer end()
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	r.snapshot(sctx)
	cancel()
	// Keep the push engine quiet until a squatter has tried to claim its
	// pod name on the open listener.
	push := r.byRef[events.WorkerRef{Pod: PushPod}]
	push.Lock()
	unlocked := false
	unlock := func() {
		if !unlocked {
			push.Unlock()
			unlocked = true
		}
	}
	defer unlock()
	r.stopDaemon(sig)
	r.mu.Lock()
	if sig == syscall.SIGKILL {
		r.killed++
	} else {
		r.terminated++
	}
	r.mu.Unlock()
	if err := r.startDaemon(); err != nil {
		r.fail.Add("daemon_start", "%v", err)
		r.abort()
		return
	}
	if err := r.waitReady(ctx, 30*time.Second); err != nil {
		if ctx.Err() == nil {
			r.fail.Add("daemon_start", "%v", err)
			r.abort()
		}
		return
	}
	r.squat(ctx)
	unlock()
	r.log.Info("daemon restarted", "signal", sig.String(), "process", r.currentProcess())
	// Time for the client to reconnect before errors count again.
	select {
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
	}
	end()
	// The new process must have relearned every cache exactly.
	r.checkpoint(ctx, fmt.Sprintf("after restart %d", r.currentProcess()-1))
}

func (r *runner) abort() {
	r.mu.Lock()
	r.aborted = true
	r.mu.Unlock()
}

// squat tries to claim PushPod's name on the open listener before its
// engine sends: the open listener must refuse it (other_listener), since
// only the allowlisted listener that routes PushPod may create it, and the
// next checkpoint finds the push worker exact.
func (r *runner) squat(ctx context.Context) {
	pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: r.fleet.OpenPushAddr(), Topic: "kv@" + PushPod + "@" + ModelA})
	if err != nil {
		r.fail.Add("squat", "%v", err)
		return
	}
	defer pub.Close()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pub.WaitForSubscribers(wctx, 1); err != nil {
		r.fail.Add("squat", "%v", err)
		return
	}
	b := &events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{1}, TokenIDs: make([]uint32, 16), BlockSize: 16}}, HasDPRank: true}
	if _, err := pub.Publish(b); err != nil {
		r.fail.Add("squat", "%v", err)
		return
	}
	time.Sleep(300 * time.Millisecond)
}

// runSampler samples the daemon every SampleEvery: VmRSS, go_goroutines,
// /metrics and ListWorkers (checked on the spot).
func (r *runner) runSampler(ctx context.Context) {
	t := time.NewTicker(r.opts.SampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.sampleOnce(ctx)
	}
}

func (r *runner) sampleOnce(ctx context.Context) {
	mark := r.window.Mark()
	if r.window.Overlaps(mark) {
		return
	}
	c, n := r.currentChild()
	mem, rerr := proc.Mem(c.Pid())
	cpu, cerr := proc.CPU(c.Pid())
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ms, merr := Scrape(sctx, r.http, r.fleet.MetricsAddr())
	lw, lerr := r.client.ListWorkers(sctx, &kvindexv1.ListWorkersRequest{})
	if r.window.Overlaps(mark) || ctx.Err() != nil {
		return
	}
	if err := errors.Join(rerr, cerr, merr, lerr); err != nil {
		r.fail.Add("sample_error", "daemon process %d: %v", n, err)
		return
	}
	g, ok := Metric(ms, "go_goroutines", nil)
	if !ok {
		r.fail.Add("sample_error", "daemon process %d: /metrics has no go_goroutines", n)
		return
	}
	r.record(n, lw.GetWorkers(), ms)
	r.mu.Lock()
	r.samples = append(r.samples, sample{at: time.Now(), process: n, settled: r.settled[n], rss: float64(mem.RSS), goroutines: g})
	r.cpu[n] = cpu.Seconds()
	r.mu.Unlock()
	r.checkWorkerList(lw.GetWorkers(), "sample")
}

// record keeps a process's latest ListWorkers and /metrics.
func (r *runner) record(process int, ws []*kvindexv1.WorkerStatus, ms Metrics) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ws != nil {
		r.lastWorkers[process] = ws
		if r.listed[process] == nil {
			r.listed[process] = map[listing]bool{}
		}
		for _, w := range ws {
			if w.GetWorker().GetDpRank() == 0 {
				r.listed[process][listing{w.GetWorker().GetPod(), w.GetEndpoint()}] = true
			}
		}
	}
	if ms != nil {
		r.lastMetrics[process] = ms
	}
}

// snapshot records the current process's ListWorkers and /metrics, best
// effort (before a restart, and at the end).
func (r *runner) snapshot(ctx context.Context) {
	_, n := r.currentChild()
	ms, _ := Scrape(ctx, r.http, r.fleet.MetricsAddr())
	lw, _ := r.client.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{})
	r.record(n, lw.GetWorkers(), ms)
}

func (r *runner) runCheckpoints(ctx context.Context) {
	t := time.NewTicker(r.opts.CheckpointEvery)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.chaos.Lock()
		if ctx.Err() == nil && !r.isAborted() {
			r.checkpoint(ctx, fmt.Sprint(n))
		}
		r.chaos.Unlock()
	}
}

// finalChecks are the end-of-run checks: each probe reached its refusal,
// the open listener filled up to max_workers and no further, and the
// last daemon process's memory and goroutines are flat.
func (r *runner) finalChecks() {
	_, n := r.currentChild()
	r.mu.Lock()
	ms := r.lastMetrics[n]
	ws := r.lastWorkers[n]
	r.mu.Unlock()
	open, allow := r.fleet.OpenPushAddr(), r.fleet.AllowPushAddr()
	for _, want := range []struct{ listener, reason string }{
		{open, "unknown_topic"}, {open, "pull_worker"}, {open, "other_listener"}, {open, "other_model"},
		{open, "max_workers"}, {open, "dp_rank"}, {open, "undecodable"}, {allow, "address"},
	} {
		if v, _ := Metric(ms, "kvindex_push_refused_total", map[string]string{"listener": want.listener, "reason": want.reason}); v == 0 {
			r.fail.Add("probe_unrefused", "daemon process %d refused nothing for reason %s on %s: the probe did not reach it", n, want.reason, want.listener)
		}
	}
	r.checkRefused(r.load.Stats())
	if got := countOn(ws, open); got != OpenMaxWorkers {
		r.fail.Add("max_workers", "the open listener created %d workers by the end, want its max_workers %d (garbage sent more pod names)", got, OpenMaxWorkers)
	}
	var rss, gor []float64
	r.mu.Lock()
	for _, s := range r.samples {
		if s.process == n && s.settled {
			rss, gor = append(rss, s.rss), append(gor, s.goroutines)
		}
	}
	r.mu.Unlock()
	for _, x := range []struct {
		what   string
		series []float64
		rule   FlatRule
	}{{"RSS", rss, RSSRule()}, {"goroutines", gor, GoroutineRule()}} {
		v, err := x.rule.Judge(x.series)
		switch {
		case err != nil:
			r.fail.Add("not_flat", "daemon process %d %s: %v", n, x.what, err)
		case !v.Flat:
			r.fail.Add("not_flat", "daemon process %d %s grew: last-third max %.0f > %.0f (first-third max %.0f x %.2f + %.0f)", n, x.what, v.LastMax, v.Limit, v.FirstMax, x.rule.Ratio, x.rule.Slack)
		}
	}
}

// checkRefused fails the run when admission control refused more of the
// load's calls for overload than Options.MaxRefused allows.
func (r *runner) checkRefused(ls LoadStats) {
	if float64(ls.Refused) > r.opts.MaxRefused*float64(ls.Calls) {
		r.fail.Add("overload_refused", "the daemon's admission control refused %d of %d Score and Route calls for overload (%.1f%%), more than max-refused %.1f%%", ls.Refused, ls.Calls, 100*float64(ls.Refused)/float64(max(ls.Calls, 1)), 100*r.opts.MaxRefused)
	}
}

func countOn(ws []*kvindexv1.WorkerStatus, endpoint string) int {
	n := 0
	for _, w := range ws {
		if w.GetEndpoint() == endpoint {
			n++
		}
	}
	return n
}

// summary assembles the run's summary.
func (r *runner) summary(elapsed time.Duration, loadStart string) *Summary {
	s := &Summary{
		Seed: r.opts.Seed, Duration: elapsed.Seconds(), Dir: r.opts.Dir,
		LoadAvgStart: loadStart, LoadAvgEnd: loadAvg(),
		Garbage: r.garbage.Counts(), Refusals: map[string]int64{},
		Load: r.load.Stats(), MaxRefused: r.opts.MaxRefused,
	}
	s.Command = r.opts.Command
	if s.Command == "" {
		s.Command = fmt.Sprintf("kvsoak --duration %v --seed %d", r.opts.Duration, r.opts.Seed)
	}
	s.Engines.Count = len(r.engines)
	for _, e := range r.engines {
		st := e.Stats()
		s.Engines.Steps += st.Steps
		s.Engines.Lost += st.Lost
		s.Engines.Events += st.Events
		s.Engines.Stored += st.Stored
		s.Engines.Removed += st.Removed
		s.Engines.Clears += st.Clears
		s.Engines.Restarts += st.Restarts
		s.Engines.Requests += st.Requests
	}
	for _, v := range s.Garbage {
		s.GarbageTotal += v
	}
	r.mu.Lock()
	s.Daemon = DaemonSummary{Processes: r.process, Terminated: r.terminated, Killed: r.killed, ErrorLogLines: r.errorLines}
	for _, c := range r.cpu {
		s.Daemon.CPUSeconds += c
	}
	for _, ws := range r.lastWorkers {
		for _, w := range ws {
			if _, ok := r.byRef[events.WorkerRef{Pod: w.GetWorker().GetPod(), DPRank: int(w.GetWorker().GetDpRank())}]; !ok {
				continue
			}
			x := &s.Index
			x.Batches += w.GetBatches()
			x.Events += w.GetEvents()
			x.Replays += w.GetReplays()
			x.ReplayedBatches += w.GetReplayedBatches()
			x.ReplayContinuations += w.GetReplayContinuations()
			x.ReplayFailures += w.GetReplayFailures()
			x.StaleReplays += w.GetStaleReplays()
			x.Gaps += w.GetGaps()
			x.MissedBatches += w.GetMissedBatches()
			x.UnrecoveredGaps += w.GetUnrecoveredGaps()
			x.Duplicates += w.GetDuplicates()
			x.Restarts += w.GetRestarts()
			x.Resets += w.GetResets()
			x.Clears += w.GetClears()
			x.Orphans += w.GetOrphans()
			x.UnknownBlocks += w.GetUnknownBlocks()
			x.ApplyErrors += w.GetApplyErrors()
			if w.GetJoinedAtSeq() > 0 {
				x.LateJoins++
			}
		}
	}
	for _, ms := range r.lastMetrics {
		ms.Each("kvindex_push_refused_total", func(l map[string]string, v float64) {
			s.Refusals[strings.TrimPrefix(l["listener"], "tcp://")+" "+l["reason"]] += int64(v)
		})
	}
	s.OpenListenerWorkers = countOn(r.lastWorkers[r.process], r.fleet.OpenPushAddr())
	s.RSS = seriesOf(r.samples, r.process, func(x sample) float64 { return x.rss }, RSSRule(), "last third <= 1.25 x first third + 8 MiB")
	s.Goroutines = seriesOf(r.samples, r.process, func(x sample) float64 { return x.goroutines }, GoroutineRule(), "last third <= 1.25 x first third + 16")
	r.mu.Unlock()
	s.Checks = CheckSummary{Checkpoints: r.checkpoints.Load(), ScoresChecked: r.scoresChecked.Load(), Comparisons: r.comparisons.Load(), WrongAnswers: r.wrong.Load(), ResidentChecks: r.residentChecks.Load()}
	s.FailureCounts, s.Failures = r.fail.Counts(), r.fail.Kept()
	s.Passed = r.fail.Count() == 0
	return s
}

func seriesOf(samples []sample, process int, get func(sample) float64, rule FlatRule, text string) SeriesSummary {
	var out SeriesSummary
	var last []float64
	for i, s := range samples {
		v := get(s)
		if i == 0 {
			out.First = v
		}
		out.Last, out.Max = v, max(out.Max, v)
		out.Samples++
		if s.process == process && s.settled {
			last = append(last, v)
		}
	}
	out.Rule = text
	out.Verdict, _ = rule.Judge(last)
	return out
}

// loadAvg returns /proc/loadavg's three load averages.
func loadAvg() string {
	l := proc.LoadAvg()
	return fmt.Sprintf("%.2f %.2f %.2f", l[0], l[1], l[2])
}
