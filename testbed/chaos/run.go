package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/soak"
)

// Options configure one seed's run (kvsoak chaos's flags say what each is).
type Options struct {
	Seed     uint64
	Duration time.Duration // the fault phase
	Replicas int
	Dir      string // the run's configuration, logs, checkpoints and store
	Bins     Binaries
	Logger   *slog.Logger // nil discards progress
}

// warmupSteps is how many steps each engine runs, quickly, before the
// faults: more than its replay buffer holds, so that an agent that
// restarts without its checkpoint could not learn the whole cache.
const warmupSteps = bufferSteps + 100

// run is one seed's run.
type run struct {
	opts    Options
	log     *slog.Logger
	dir     string
	plan    Plan
	bounds  Bounds
	sched   []Fault
	lay     *Layout
	net     *Net
	engines []*Engine
	systems [][]uint32
	nats    *child
	agents  []*child
	http    *http.Client
	beats   heartbeats
	usage   usages
	check   *checker
	start   time.Time      // the fault phase's start
	pending sync.WaitGroup // releases and resume checks

	replicas []*child
	rclients []*api.Client
	aclients []*api.Client

	mu            sync.Mutex // guards the fields below
	violations    []Violation
	applied       map[Kind]int
	appliedOn     map[string]int // by Fault.Class
	active        map[int]Fault
	harnessErrs   []string
	counts        map[string]int64
	slowConsumers int64
	end           map[string]json.RawMessage // endState, after the convergence
}

// Run runs one seed: it starts the fleet, warms it up, runs the seed's
// schedule of faults under load while checking every answer, then stops
// the faults and checks that the fleet converges and stayed within its
// bounds. The error reports a run that could not be carried out; the
// fleet's failures are the summary's violations.
func Run(ctx context.Context, opts Options) (*Summary, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	shape := Shape{Engines: 2, Replicas: opts.Replicas}
	r := &run{opts: opts, log: opts.Logger, dir: opts.Dir, plan: DefaultPlan(shape, opts.Duration),
		http: &http.Client{Timeout: 3 * time.Second}, applied: map[Kind]int{}, appliedOn: map[string]int{}, active: map[int]Fault{}, counts: map[string]int64{}}
	if err := r.plan.Validate(); err != nil {
		return nil, err
	}
	r.bounds = DefaultBounds(r.plan)
	r.sched = Schedule(opts.Seed, r.plan)
	t0 := time.Now()
	// Past its time, a run is stuck: dump the harness and stop.
	ctx, cancel := context.WithTimeout(ctx, opts.Duration+4*time.Minute)
	defer cancel()
	defer r.teardown()
	if err := r.setup(ctx); err != nil {
		return nil, err
	}
	r.check = newChecker(r)
	// The engines step from here to the end, idle (empty batches) while
	// the fleet must converge: a message lost at the end of the warm-up
	// shows as a gap only when the next one comes, and a silent engine
	// leaves its worker STALE.
	steps, stopSteps := context.WithCancel(ctx)
	var stepping sync.WaitGroup
	defer stepping.Wait()
	defer stopSteps()
	for i, e := range r.engines {
		e.Idle(true)
		stepping.Go(func() {
			r.every(steps, EngineName(i), stepEvery, func() {
				if err := e.Step(time.Now()); err != nil {
					r.harnessError("%v", err)
				}
			})
		})
	}
	if took, ok := r.converge(ctx, 30*time.Second, "before the faults"); ok {
		r.log.Info("fleet synced", "took", took.Round(time.Millisecond))
	}
	converged, ok := r.phases(ctx)
	stopSteps()
	if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return nil, fmt.Errorf("chaos: interrupted: %w", ctx.Err())
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		path, stuck := selfDump(r.dir)
		r.violate("d", "harness_stuck", "the run did not end within %v; stuck goroutines: %s; dump %s", opts.Duration+4*time.Minute, strings.Join(first(stuck, 3), "; "), path)
	}
	r.finish()
	return r.summary(time.Since(t0), converged, ok), nil
}

// setup starts the network, the engines, nats-server, the agents and the
// replicas, and warms the engines up.
func (r *run) setup(ctx context.Context) error {
	var err error
	if r.lay, err = NewLayout(r.plan.Shape, r.dir); err != nil {
		return err
	}
	r.net = NewNet()
	r.systems = soak.SystemPrompts(r.opts.Seed, Model, BlockSize, 4)
	for i, e := range r.lay.Engines {
		ports := [][2]int{{e.PubLink, e.Pub}, {e.ReplayLink, e.Replay}}
		for k, name := range []string{PubLink(i), ReplayLink(i)} {
			if _, err := r.net.Add(name, hostPort(ports[k][0]), hostPort(ports[k][1])); err != nil {
				return err
			}
		}
		eng, err := NewEngine(EngineConfig{Index: i, Pod: PodName(i), Model: Model, BlockSize: BlockSize, Capacity: Capacity,
			PubPort: e.Pub, ReplayPort: e.Replay, BufferSteps: bufferSteps, LossEvery: lossEvery, Seed: r.opts.Seed, Systems: r.systems})
		if err != nil {
			return err
		}
		r.engines = append(r.engines, eng)
	}
	if err := r.startNATS(ctx); err != nil {
		return err
	}
	for i, a := range r.lay.Agents {
		if _, err := r.net.Add(NATSLink(AgentName(i)), hostPort(a.NATSLink), hostPort(r.lay.NATSPort)); err != nil {
			return err
		}
		c, client, err := r.startKvindex(AgentName(i), "agent", r.lay.AgentConfig(i), a.GRPC)
		if err != nil {
			return err
		}
		r.agents, r.aclients = append(r.agents, c), append(r.aclients, client)
		if err := c.waitReady(ctx, 30*time.Second); err != nil {
			return err
		}
	}
	for i, e := range r.engines {
		wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := e.WaitForSubscribers(wctx)
		cancel()
		if err != nil {
			return fmt.Errorf("chaos: agent %d never subscribed: %w", i, err)
		}
	}
	for j, p := range r.lay.Replicas {
		if _, err := r.net.Add(NATSLink(ReplicaName(j)), hostPort(p.NATSLink), hostPort(r.lay.NATSPort)); err != nil {
			return err
		}
		c, client, err := r.startKvindex(ReplicaName(j), "serve", r.lay.ReplicaConfig(j), p.GRPC)
		if err != nil {
			return err
		}
		r.replicas, r.rclients = append(r.replicas, c), append(r.rclients, client)
		if err := c.waitReady(ctx, 30*time.Second); err != nil {
			return err
		}
	}
	for range warmupSteps {
		for _, e := range r.engines {
			if err := e.Step(time.Now()); err != nil {
				return err
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// startNATS starts nats-server with JetStream, its store in the run's
// directory.
func (r *run) startNATS(ctx context.Context) error {
	r.nats = &child{name: NATS, bin: r.opts.Bins.NATS, dir: r.dir, exited: r.exited,
		args: []string{"-a", "127.0.0.1", "-p", strconv.Itoa(r.lay.NATSPort), "-m", strconv.Itoa(r.lay.NATSMonitor),
			"-js", "-sd", filepath.Join(r.dir, "nats-store"), "-n", "chaos"},
		ready: func(ctx context.Context) error {
			var v struct {
				Status string `json:"status"`
			}
			return r.getJSON(ctx, fmt.Sprintf("http://%s/healthz", hostPort(r.lay.NATSMonitor)), &v)
		}}
	if err := r.nats.start(); err != nil {
		return err
	}
	return r.nats.waitReady(ctx, 30*time.Second)
}

// startKvindex writes cfg, dials grpcPort and starts kvindex cmd (agent
// or serve) as name with it; the caller waits until it answers.
func (r *run) startKvindex(name, cmd string, cfg *config.Config, grpcPort int) (*child, *api.Client, error) {
	path, err := r.lay.writeConfig(name+".yaml", cfg)
	if err != nil {
		return nil, nil, err
	}
	client, err := api.Dial(context.Background(), hostPort(grpcPort), dialOptions...)
	if err != nil {
		return nil, nil, err
	}
	c := &child{name: name, bin: r.opts.Bins.Kvindex, dir: r.dir, args: []string{cmd, "--config", path}, ready: listReady(client), exited: r.exited}
	if err := c.start(); err != nil {
		_ = client.Close()
		return nil, nil, err
	}
	return c, client, nil
}

// phases runs the fault phase and the convergence after it, and returns
// how long the fleet took to converge once the faults stopped.
func (r *run) phases(ctx context.Context) (time.Duration, bool) {
	work, stop := context.WithCancel(ctx)
	defer stop()
	var loops sync.WaitGroup
	for _, e := range r.engines {
		e.Idle(false)
	}
	routes, stopRoutes := context.WithCancel(work)
	defer stopRoutes()
	r.start = time.Now()
	loops.Go(func() { r.runScores(work) })
	loops.Go(func() { r.runRoutes(routes) })
	loops.Go(func() { r.runSampler(work) })
	loops.Go(func() { r.watchProcesses(work) })
	r.log.Info("faults begin", "seed", r.opts.Seed, "faults", len(r.sched), "for", r.opts.Duration)
	r.runSchedule(ctx)
	// The faults have stopped: no more routed requests, the engines' caches
	// stand still (their streams go on, empty), the scores go on.
	stopRoutes()
	for _, e := range r.engines {
		e.Idle(true)
	}
	took, ok := r.converge(ctx, r.bounds.Converge, "after the faults")
	r.log.Info("converged", "ok", ok, "took", took.Round(time.Millisecond))
	r.end = r.endState(ctx)
	stop()
	loops.Wait()
	r.sampleAll(ctx, true) // the last samples, for the leak check
	return took, ok
}

// finish settles the pending answers, checks for leaks and stops the
// fleet (replicas, agents, then nats-server), scanning every log for
// crashes.
func (r *run) finish() {
	r.pending.Wait()
	r.check.resolve(time.Now(), true)
	r.checkLeaks()
	var wg sync.WaitGroup
	for _, group := range [][]*child{r.replicas, r.agents, {r.nats}} {
		for _, c := range group {
			wg.Go(func() {
				if err := c.close(); err != nil {
					r.violate("d", "unclean_exit", "%s at the end of the run: %v", c.name, err)
				}
			})
		}
		wg.Wait()
	}
	for _, c := range r.children() {
		_, n, _, _ := c.state()
		for k := 1; k <= n; k++ {
			line, err := ScanLog(c.logPath(k))
			if err != nil {
				r.harnessError("%v", err)
			}
			if line != "" {
				r.violate("d", "crash", "%s (instance %d) logged %.300q (log %s)", c.name, k, line, c.logPath(k))
			}
		}
	}
}

// teardown ends everything a run started, whatever state it is in.
func (r *run) teardown() {
	for _, c := range r.children() {
		c.kill()
	}
	for _, c := range append(slices.Clone(r.rclients), r.aclients...) {
		_ = c.Close()
	}
	for _, e := range r.engines {
		e.Close()
	}
	if r.net != nil {
		r.net.Close()
	}
}

// children are the fleet's processes.
func (r *run) children() []*child {
	var out []*child
	if r.nats != nil {
		out = append(out, r.nats)
	}
	return append(append(out, r.agents...), r.replicas...)
}

// child returns the process named name.
func (r *run) child(name string) *child {
	for _, c := range r.children() {
		if c.name == name {
			return c
		}
	}
	return nil
}

// exited reports a process that exited by itself.
func (r *run) exited(c *child, instance int, err error) {
	line, _ := ScanLog(c.logPath(instance))
	r.violate("d", "process_exit", "%s (instance %d) exited by itself: %v; its log: %.300q (%s)", c.name, instance, err, line, c.logPath(instance))
	if err := c.start(); err != nil {
		r.harnessError("restart %s after it exited: %v", c.name, err)
	}
}

// engineOf returns the engine a target names ("engine-i").
func (r *run) engineOf(name string) *Engine { return r.engines[r.indexOf(name)] }

// indexOf returns the number at the end of a name ("agent-1": 1).
func (r *run) indexOf(name string) int {
	n, _ := strconv.Atoi(name[strings.LastIndexByte(name, '-')+1:])
	return n
}

// podIndex returns the engine of pod, or -1.
func (r *run) podIndex(pod string) int {
	for i := range r.engines {
		if PodName(i) == pod {
			return i
		}
	}
	return -1
}

// activeFaults describes the faults in effect now.
func (r *run) activeFaults() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := slices.Sorted(maps.Keys(r.active))
	var out []string
	for _, id := range ids {
		out = append(out, strings.TrimSpace(r.active[id].String()))
	}
	if len(out) == 0 {
		return "none"
	}
	return "[" + strings.Join(out, "] [") + "]"
}

func (r *run) count(name string) {
	r.mu.Lock()
	r.counts[name]++
	r.mu.Unlock()
}

// harnessError records a failure of the harness itself (a fault it could
// not apply): the run proves nothing and fails.
func (r *run) harnessError(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.log.Error("harness error", "err", msg)
	r.mu.Lock()
	r.harnessErrs = append(r.harnessErrs, msg)
	r.mu.Unlock()
}

// dialOptions reconnect quickly to a process that restarted.
var dialOptions = []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
	MinConnectTimeout: 2 * time.Second,
})}

// listReady is a kvindex process's readiness: ListWorkers answers.
func listReady(client *api.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := client.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{})
		return err
	}
}
