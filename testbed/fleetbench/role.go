package fleetbench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/kvindex/kvindex/testbed/proc"
)

// Options configure a benchmark (kvfleetbench's flags say which reads
// which); the generator process gets them as JSON.
type Options struct {
	// Workers are the agents, one worker each (ingest, sync), or the
	// engines, one agent each (lag).
	Workers int    `json:"workers,omitempty"`
	Shape   Shape  `json:"shape"`
	Seed    uint64 `json:"seed"`
	// Rate is the new blocks a second, all sources together (open loop),
	// sent for about Duration; WarmRate the warm-up lap's, which brings
	// every worker to its steady state first.
	Rate     float64       `json:"rate,omitempty"`
	Duration time.Duration `json:"duration,omitempty"`
	WarmRate float64       `json:"warm_rate,omitempty"`
	// Profile is a CPU profile of the replica while it is measured.
	Profile string  `json:"-"`
	Pin     Pinning `json:"-"`
	// CacheDir keeps the sync generator's snapshots between runs.
	CacheDir string `json:"cache_dir,omitempty"`
	// Rounds (lag, 0 means 1) runs the floor and the path in turn.
	Rounds int `json:"-"`
	// AgentProcs (lag) is how many processes the agents (and the floor's
	// forwarders) run in, on the generator's CPUs; 0: in the generator's.
	AgentProcs int `json:"agent_procs,omitempty"`
	// Binary (agent) is the kvindex binary ("": beside this executable,
	// else on PATH); it runs Settle before it is measured.
	Binary string        `json:"-"`
	Settle time.Duration `json:"-"`
}

// Pinning is the CPUs (taskset's list form; "": the kernel's choice) of a
// benchmark's replica (or floor subscriber) and of its generator, so that
// a floor and the path it bounds see the same machine. A pinned process's
// GOMAXPROCS is its CPUs.
type Pinning struct {
	Replica   string `json:"replica,omitempty"`
	Generator string `json:"generator,omitempty"`
}

// Each benchmark runs its parts as processes of the same binary (roles),
// started with their options as JSON; a role reports on its stdout, one
// JSON object with an "event" field a line, and reads commands on its
// stdin, one a line; closing stdin tells it to finish.

// Role is a part of a benchmark that runs in a process of its own.
type Role func(ctx context.Context, opts json.RawMessage, in *Commands, out *Reporter) error

var roles = map[string]Role{
	"fixed-gen":   role(runFixedGenerator),
	"lag-gen":     role(runLagGenerator),
	"lag-agents":  role(runLagAgents),
	"engines-gen": role(runEnginesGenerator),
	"replica":     role(runReplica),
}

// role is run as a Role: its options decoded from JSON first.
func role[O any](run func(ctx context.Context, o O, in *Commands, out *Reporter) error) Role {
	return func(ctx context.Context, raw json.RawMessage, in *Commands, out *Reporter) error {
		var o O
		if err := json.Unmarshal(raw, &o); err != nil {
			return fmt.Errorf("fleetbench: role options %s: %w", raw, err)
		}
		return run(ctx, o, in, out)
	}
}

// RunRole runs role name in this process with its options as JSON,
// reading commands from in and reporting to out.
func RunRole(ctx context.Context, name, opts string, in io.Reader, out io.Writer) error {
	r, ok := roles[name]
	if !ok {
		return fmt.Errorf("fleetbench: unknown role %q", name)
	}
	c := make(chan string, 16)
	go func() {
		defer close(c)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			c <- strings.TrimSpace(sc.Text())
		}
	}()
	rep := &Reporter{w: out}
	err := r(ctx, json.RawMessage(opts), &Commands{C: c}, rep)
	if err != nil {
		_ = rep.Send("error", struct {
			Error string `json:"error"`
		}{err.Error()})
	}
	return err
}

// Reporter writes a role's messages, one JSON object a line.
type Reporter struct{ w io.Writer }

// Send writes v, which must marshal to an object, with its event name.
func (r *Reporter) Send(event string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("fleetbench: report %s: %w", event, err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		m = map[string]json.RawMessage{}
	}
	m["event"], _ = json.Marshal(event)
	b, _ = json.Marshal(m)
	_, err = fmt.Fprintf(r.w, "%s\n", b)
	return err
}

// Commands are the lines the orchestrator sends a role, until its stdin
// closes.
type Commands struct{ C <-chan string }

// Next returns the next command, or false when stdin closes or ctx ends.
func (c *Commands) Next(ctx context.Context) (string, bool) {
	select {
	case <-ctx.Done():
		return "", false
	case got, ok := <-c.C:
		return got, ok
	}
}

// Wait returns when command cmd arrives, stdin closes (io.EOF) or ctx
// ends.
func (c *Commands) Wait(ctx context.Context, cmd string) error {
	for {
		got, ok := c.Next(ctx)
		if !ok && ctx.Err() != nil {
			return ctx.Err()
		} else if !ok {
			return io.EOF
		}
		if got == cmd {
			return nil
		}
	}
}

// Exit returns on "exit", when stdin closes or ctx ends.
func (c *Commands) Exit(ctx context.Context) error {
	if err := c.Wait(ctx, "exit"); err != nil && err != io.EOF {
		return err
	}
	return nil
}

// sleep waits d, or returns ctx's error when it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// genOpts are a generator role's options.
type genOpts struct {
	Options
	Laps    int  `json:"laps,omitempty"`    // ingest: laps of every worker
	Batches int  `json:"batches,omitempty"` // lag, agent: engine batches to play
	Procs   int  `json:"procs,omitempty"`   // sync: the restore floor's goroutines
	Floor   bool `json:"floor,omitempty"`   // lag: forwarders instead of agents
}

// genReady is a generator's "ready".
type genReady struct {
	URL      string            `json:"url"`
	Blocks   int64             `json:"blocks,omitempty"` // ingest: per lap of every worker
	Keys     int64             `json:"keys,omitempty"`
	Resident int64             `json:"resident,omitempty"`
	Bytes    int64             `json:"bytes,omitempty"`
	Digests  map[string]string `json:"digests,omitempty"`
	Config   string            `json:"config,omitempty"` // engines: the agent's configuration, YAML
}

// genDone is a generator's "done", "cpu" or "floor": Batches are the
// engine batches sent, Forwarded the frames the lag floor published.
type genDone struct {
	Blocks     int64 `json:"blocks,omitempty"`
	WallNs     int64 `json:"wall_ns,omitempty"`
	CPUNs      int64 `json:"cpu_ns"`
	Slow       int64 `json:"slow_consumers,omitempty"`
	AgentP50Ns int64 `json:"agent_p50_ns,omitempty"`
	AgentP99Ns int64 `json:"agent_p99_ns,omitempty"`
	Batches    int64 `json:"batches,omitempty"`
	Forwarded  int64 `json:"forwarded,omitempty"`
}

func (d *genDone) rate() float64 {
	if d.WallNs <= 0 {
		return 0
	}
	return float64(d.Blocks) / time.Duration(d.WallNs).Seconds()
}

// Shared is what every two-process benchmark reports: both processes'
// CPU over the measured phase and other processes' meanwhile, whether
// every worker's digest in the replica equals its source's, and the
// 1-minute load average around the run.
type Shared struct {
	ReplicaCPU   time.Duration `json:"replica_cpu_ns"`
	GeneratorCPU time.Duration `json:"generator_cpu_ns"`
	OtherCPU     time.Duration `json:"other_cpu_ns"`
	DigestsOK    bool          `json:"digests_ok"`
	LoadBefore   float64       `json:"load_before"`
	LoadAfter    float64       `json:"load_after"`
}

func (s *Shared) other(busy0, busy1 time.Duration) {
	s.OtherCPU = max(0, busy1-busy0-s.ReplicaCPU-s.GeneratorCPU)
}

// startGen starts generator role name and waits for its "ready".
func startGen(ctx context.Context, name, cpus string, o genOpts, timeout time.Duration) (*child, *genReady, error) {
	var ready genReady
	gen, _, err := startAwait(ctx, name, cpus, o, "ready", &ready, timeout)
	return gen, &ready, err
}

// startReplica starts the replica role with GOMAXPROCS procs (0: Go's
// default) and waits until its workers are live.
func startReplica(ctx context.Context, o replicaOpts, procs int, cpus string) (*child, *liveReport, time.Time, error) {
	var env []string
	if procs > 0 {
		env = []string{fmt.Sprintf("GOMAXPROCS=%d", procs)}
	}
	var live liveReport
	rep, at, err := startAwait(ctx, "replica", cpus, o, "live", &live, 4*time.Minute, env...)
	return rep, &live, at, err
}

// startAwait starts role name (startChild) and awaits its event into v;
// on an error it kills the process.
func startAwait(ctx context.Context, name, cpus string, opts any, event string, v any, timeout time.Duration, env ...string) (*child, time.Time, error) {
	c, err := startChild(ctx, name, cpus, opts, env...)
	if err != nil {
		return nil, time.Time{}, err
	}
	at, err := c.await(event, v, timeout)
	if err != nil {
		c.Kill()
		return nil, at, err
	}
	return c, at, nil
}

// finish lets both processes end, the replica first.
func finish(gen, rep *child, s *Shared) error {
	if err := rep.finish(30 * time.Second); err != nil {
		return err
	}
	if err := gen.finish(time.Minute); err != nil {
		return err
	}
	s.LoadAfter = proc.LoadAvg()[0]
	return nil
}

// child is a role running in another process.
type child struct {
	*proc.Process
	stdin   io.WriteCloser
	lines   chan []byte
	started time.Time
}

// startChild starts role name in a new process of this binary on CPUs
// cpus ("": any; else through taskset, which execs the role), with opts
// as its options and its stderr shared with this process.
func startChild(ctx context.Context, name, cpus string, opts any, env ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("fleetbench: start %s: %w", name, err)
	}
	b, _ := json.Marshal(opts) // role options are plain structs
	args := []string{self, "role", name, "--opts", string(b)}
	if cpus != "" {
		taskset, err := exec.LookPath("taskset")
		if err != nil {
			return nil, fmt.Errorf("fleetbench: start %s on CPUs %s: %w", name, cpus, err)
		}
		args = append([]string{taskset, "-c", cpus}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	c := &child{lines: make(chan []byte, 64), started: time.Now()}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("fleetbench: start %s: %w", name, err)
	}
	// exec copies the role's stdout into pw until it exits.
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	if c.Process, err = proc.Start(name, cmd, ""); err != nil {
		return nil, err
	}
	go func() {
		<-c.Done()
		pw.Close()
	}()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<16), 64<<20)
		for sc.Scan() {
			c.lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(c.lines)
		_, _ = io.Copy(io.Discard, pr)
	}()
	return c, nil
}

// await decodes into v (unless nil) the next message of event, skipping
// others, within timeout, and returns when it arrived.
func (c *child) await(event string, v any, timeout time.Duration) (time.Time, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return time.Time{}, fmt.Errorf("fleetbench: %s: no %q within %v", c.Name, event, timeout)
		case line, ok := <-c.lines:
			if !ok {
				<-c.Done()
				return time.Time{}, fmt.Errorf("fleetbench: role process %s ended before %q: %v", c.Name, event, c.Err())

			}
			at := time.Now()
			var env struct {
				Event string `json:"event"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal(line, &env); err != nil {
				return at, fmt.Errorf("fleetbench: %s: bad message %q: %w", c.Name, line, err)
			}
			if env.Event == "error" {
				return at, fmt.Errorf("fleetbench: %s: %s", c.Name, env.Error)
			}
			if env.Event != event {
				continue
			}
			if v != nil {
				if err := json.Unmarshal(line, v); err != nil {
					return at, fmt.Errorf("fleetbench: %s: %q: %w", c.Name, event, err)
				}
			}
			return at, nil
		}
	}
}

func (c *child) send(cmd string) error {

	if _, err := io.WriteString(c.stdin, cmd+"\n"); err != nil {
		return fmt.Errorf("fleetbench: %s: command %q: %w", c.Name, cmd, err)
	}
	return nil
}

// ask sends cmd and awaits its answer, an event of that name.
func (c *child) ask(cmd string, v any, timeout time.Duration) error {
	if err := c.send(cmd); err != nil {
		return err
	}
	_, err := c.await(cmd, v, timeout)
	return err
}

// finish closes the child's stdin and waits for it to exit.
func (c *child) finish(timeout time.Duration) error {
	_ = c.stdin.Close()
	go func() {
		for range c.lines {
		}
	}()
	return c.Wait(timeout)
}
