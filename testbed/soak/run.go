package soak

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/proc"
)

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
	garbage *Garbage

	// chaos serialises engine restarts, daemon restarts and checkpoints.
	chaos sync.Mutex

	aborted atomic.Bool // a failure ended the run
	load    counters    // Summary.Load
	checks  counters    // Summary.Checks

	mu       sync.Mutex // guards the fields below
	child    *proc.Process
	process  int                      // the current daemon process's number
	restarts map[events.WorkerRef]int // engine restarts during the current process
	// reported is, per worker counter of the current process, its excess
	// already reported as a failure, so that one failure is reported once.
	reported    map[workerCounter]uint64
	flow        map[events.WorkerRef]blockFlow    // at the last checkpoint
	listed      map[int]map[listing]bool          // by process: the push workers ListWorkers has shown
	lastWorkers map[int][]*kvindexv1.WorkerStatus // by process
	lastMetrics map[int]Metrics                   // by process
	samples     []sample
	settled     map[int]bool    // processes with a passed checkpoint
	cpu         map[int]float64 // each process's last CPU seconds
	terminated  int
	killed      int
	errorLines  int
}

// Run runs a soak with opts and returns its summary. The error reports a
// run that could not be set up or carried out; failures of the daemon
// under test are in the summary (Passed false).
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
		restarts: map[events.WorkerRef]int{}, reported: map[workerCounter]uint64{}, flow: map[events.WorkerRef]blockFlow{}, listed: map[int]map[listing]bool{},
		lastWorkers: map[int][]*kvindexv1.WorkerStatus{}, lastMetrics: map[int]Metrics{},
		settled: map[int]bool{}, cpu: map[int]float64{},
	}
	start := time.Now()
	loadStart := loadAvg()
	defer func() {
		for _, e := range r.engines {
			_ = e.Close()
		}
	}()
	if err := r.setup(ctx); err != nil {
		return nil, err
	}
	if err := r.startDaemon(); err != nil {
		return nil, err
	}
	defer func() { // no daemon outlives Run
		c, _ := r.currentChild()
		c.Kill()
	}()
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
	if r.garbage, err = newGarbage(r); err != nil {
		return nil, err
	}
	defer r.garbage.Close()

	work, stopWork := context.WithCancel(ctx)
	defer stopWork()
	var wg sync.WaitGroup
	for i, e := range r.engines {
		wg.Go(func() { r.runEngine(work, e, i) })
	}
	for _, f := range []func(context.Context){r.runScores, r.runRoutes, r.garbage.run, r.runSampler, r.runChaos, r.runCheckpoints} {
		wg.Go(func() { f(work) })
	}
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

	if !r.aborted.Load() {
		fctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		r.chaos.Lock()
		r.checkpoint(fctx, "final")
		r.chaos.Unlock()
		r.snapshot(fctx)
		cancel()
		r.finalChecks()
		r.stopDaemon(syscall.SIGTERM)
	}
	return r.summary(elapsed, loadStart), nil
}

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
	r.log.Info("building the daemon", "go", r.opts.GoTool)
	if r.bin, err = proc.Build(ctx, r.opts.GoTool, r.opts.Dir, "github.com/kvindex/kvindex/cmd/kvindex"); err != nil {
		return err
	}
	for i, spec := range r.fleet.Engines() {
		e, err := NewEngine(spec, DefaultEngineOptions(), r.opts.Seed, i, SystemPrompts(r.opts.Seed, spec.Model, BlockSizeOf(spec.Model), 4))
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

func (r *runner) currentChild() (*proc.Process, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.child, r.process
}

// workerCounter names one ListWorkers counter of one worker.
type workerCounter struct {
	ref  events.WorkerRef
	name string
}

// listing is a push worker (rank 0) and the listener that created it.
type listing struct{ pod, endpoint string }

// Process returns the current daemon process's number.
func (r *runner) Process() int {
	_, n := r.currentChild()
	return n
}

// Settled reports whether a checkpoint of daemon process n has passed:
// its join replays are over, and no worker may be DEGRADED any more.
func (r *runner) Settled(n int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.settled[n]
}

// Listed reports whether daemon process n listed pod on the push listener at endpoint.
func (r *runner) Listed(n int, pod, endpoint string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.listed[n][listing{pod, endpoint}]
}

func (r *runner) abort(
	kind, format string, args ...any) {
	r.fail.Add(kind, format, args...)
	r.aborted.Store(true)
}

// sleep waits d and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// every calls f every d, counting its calls from 0, until ctx is done.
func every(ctx context.Context, d time.Duration, f func(i int)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(i)
		}
	}
}
