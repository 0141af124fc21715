package fleetbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Processes. Each benchmark runs its parts as separate processes of the
// same binary (Roles): the orchestrator starts a role with its options as
// JSON, and the role reports on its stdout, one JSON message a line, each
// with an "event" field; the orchestrator sends it commands on its stdin,
// one a line, and closing stdin tells it to finish.

// Role is a part of a benchmark that runs in a process of its own.
type Role func(ctx context.Context, opts json.RawMessage, in *Commands, out *Reporter) error

// Roles are the roles by name (RunRole).
var roles = map[string]Role{
	"ingest-gen":  runIngestGenerator,
	"sync-gen":    runSyncGenerator,
	"lag-gen":     runLagGenerator,
	"engines-gen": runEnginesGenerator,
	"replica":     runReplica,
}

// RoleNames lists the roles RunRole knows.
func RoleNames() []string {
	names := make([]string, 0, len(roles))
	for n := range roles {
		names = append(names, n)
	}
	return names
}

// RunRole runs role name in this process with its options as JSON,
// reading commands from in and reporting to out.
func RunRole(ctx context.Context, name, opts string, in io.Reader, out io.Writer) error {
	r, ok := roles[name]
	if !ok {
		return fmt.Errorf("fleetbench: unknown role %q", name)
	}
	rep := &Reporter{w: out}
	// KVFLEETBENCH_PROFILE_<ROLE> (dashes as underscores) profiles a
	// whole role, set-up included.
	if path := os.Getenv("KVFLEETBENCH_PROFILE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))); path != "" {
		stop, err := startProfile(path)
		if err != nil {
			return err
		}
		defer stop()
	}
	err := r(ctx, json.RawMessage(opts), newCommands(in), rep)
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

// Commands are the lines the orchestrator sends a role; the channel closes
// when its stdin does.
type Commands struct{ C <-chan string }

func newCommands(in io.Reader) *Commands {
	c := make(chan string, 16)
	go func() {
		defer close(c)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			c <- strings.TrimSpace(sc.Text())
		}
	}()
	return &Commands{C: c}
}

// Wait returns when command cmd arrives (nil), stdin closes or ctx ends.
func (c *Commands) Wait(ctx context.Context, cmd string) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case got, ok := <-c.C:
			if !ok {
				return io.EOF
			}
			if got == cmd {
				return nil
			}
		}
	}
}

// child is a role running in another process.
type child struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan []byte
	started time.Time
	done    chan error
}

// startChild starts role name in a new process of this binary, with opts
// marshalled as its options and its stderr shared with this process.
func startChild(ctx context.Context, name string, opts any, env ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("fleetbench: start %s: %w", name, err)
	}
	b, err := json.Marshal(opts)
	if err != nil {
		return nil, fmt.Errorf("fleetbench: start %s: %w", name, err)
	}
	cmd := exec.CommandContext(ctx, self, "role", name, "--opts", string(b))
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	c := &child{name: name, cmd: cmd, lines: make(chan []byte, 64), done: make(chan error, 1)}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("fleetbench: start %s: %w", name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("fleetbench: start %s: %w", name, err)
	}
	c.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fleetbench: start %s: %w", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<16), 64<<20)
		for sc.Scan() {
			c.lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(c.lines)
		c.done <- cmd.Wait()
	}()
	return c, nil
}

// errChildExited: a role ended before sending what was awaited.
var errChildExited = errors.New("fleetbench: role process ended")

// await returns the time it arrived and decodes into v the next message
// of event, skipping others; within timeout.
func (c *child) await(event string, v any, timeout time.Duration) (time.Time, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return time.Time{}, fmt.Errorf("fleetbench: %s: no %q within %v", c.name, event, timeout)
		case line, ok := <-c.lines:
			if !ok {
				err := <-c.done
				c.done <- err
				return time.Time{}, fmt.Errorf("%w: %s before %q: %v", errChildExited, c.name, event, err)
			}
			at := time.Now()
			var env struct {
				Event string `json:"event"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal(line, &env); err != nil {
				return at, fmt.Errorf("fleetbench: %s: bad message %q: %w", c.name, line, err)
			}
			if env.Event == "error" {
				return at, fmt.Errorf("fleetbench: %s: %s", c.name, env.Error)
			}
			if env.Event != event {
				continue
			}
			if v == nil {
				return at, nil
			}
			if err := json.Unmarshal(line, v); err != nil {
				return at, fmt.Errorf("fleetbench: %s: %q: %w", c.name, event, err)
			}
			return at, nil
		}
	}
}

// send writes one command line.
func (c *child) send(cmd string) error {
	if _, err := io.WriteString(c.stdin, cmd+"\n"); err != nil {
		return fmt.Errorf("fleetbench: %s: command %q: %w", c.name, cmd, err)
	}
	return nil
}

// finish closes the child's stdin and waits for it to exit.
func (c *child) finish(timeout time.Duration) error {
	_ = c.stdin.Close()
	go func() {
		for range c.lines {
		}
	}()
	select {
	case err := <-c.done:
		c.done <- err
		if err != nil {
			return fmt.Errorf("fleetbench: %s: %w", c.name, err)
		}
		return nil
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		return fmt.Errorf("fleetbench: %s did not exit within %v; killed", c.name, timeout)
	}
}

// kill ends the child at once (on an error path).
func (c *child) kill() {
	if c != nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Kill()
	}
}

// cpuTime returns the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peakRSS returns this process's peak resident set size in bytes
// (getrusage's ru_maxrss, in KiB on Linux).
func peakRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Maxrss << 10
}

// procCPU returns the CPU time (utime + stime) process pid has used, from
// /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("fleetbench: CPU of process %d: %w", pid, err)
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing parenthesis (state is field 3).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("fleetbench: /proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("fleetbench: /proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("fleetbench: /proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	const clkTck = 100 // USER_HZ: 100 on every Linux architecture Go supports
	return time.Duration(utime+stime) * time.Second / clkTck, nil
}

// procMem returns the current and peak resident set size of process pid
// in bytes (VmRSS and VmHWM of /proc/<pid>/status).
func procMem(pid int) (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("fleetbench: memory of process %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v << 10
		case "VmHWM:":
			peak = v << 10
		}
	}
	return rss, peak, nil
}

// loadAvg returns the 1-minute load average, -1 when unknown.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// busyCPU returns the CPU time every process of the machine has used
// (user, nice, system, irq, softirq, steal of /proc/stat), to tell how
// much other processes ran during a measurement.
func busyCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * time.Second / 100
}
