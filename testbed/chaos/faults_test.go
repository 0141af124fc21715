package chaos

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"
)

// childEnv makes the test binary a stand-in for a fleet process: it runs
// until SIGTERM, then exits with status 0; as "stuck", with a goroutine
// blocked on a lock for good.
const childEnv = "KVINDEX_CHAOS_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "1", "stuck":
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		if os.Getenv(childEnv) == "stuck" {
			var mu sync.Mutex
			mu.Lock()
			n := 0
			go stuckOnLock(&mu, make(chan struct{}), &n)
		}
		<-sig
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// faultRun is a run with one engine, a link per link name of the shape
// (each to an echo server), and stand-in processes for nats, agent-0 and
// replica-0.
func faultRun(t *testing.T) *run {
	t.Helper()
	t.Setenv(childEnv, "1")
	shape := Shape{Engines: 1, Replicas: 1}
	p := DefaultPlan(shape, 40*time.Second)
	dir := t.TempDir()
	r := &run{opts: Options{Seed: 1, Duration: p.Duration, Replicas: 1}, log: slog.New(slog.DiscardHandler), dir: dir, plan: p,
		bounds: DefaultBounds(p), lay: &Layout{Shape: shape, Dir: dir}, net: NewNet(),
		applied: map[Kind]int{}, appliedOn: map[string]int{}, active: map[int]Fault{}, counts: map[string]int64{}}
	t.Cleanup(r.teardown)
	for _, name := range shape.Links() {
		if _, err := r.net.Add(name, "127.0.0.1:0", echoServer(t)); err != nil {
			t.Fatal(err)
		}
	}
	r.engines = []*Engine{newTestEngine(t, 0)}
	ready := func(context.Context) error { return nil }
	newChild := func(name string) *child {
		c := &child{name: name, bin: os.Args[0], dir: dir, args: []string{"-test.run=^$"}, ready: ready, exited: r.exited}
		if err := c.start(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	r.nats = newChild(NATS)
	r.agents = []*child{newChild(AgentName(0))}
	r.replicas = []*child{newChild(ReplicaName(0))}
	return r
}

// linkConn is a connection through a link to its echo server.
type linkConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialLink(t *testing.T, r *run, name string) *linkConn {
	t.Helper()
	c, err := net.Dial("tcp", r.net.Link(name).Listen)
	if err != nil {
		t.Fatalf("dial %s: %v", name, err)
	}
	t.Cleanup(func() { c.Close() })
	return &linkConn{c, bufio.NewReader(c)}
}

// echo sends size bytes and a newline and waits up to wait for their
// echo; it returns how long that took, or an error.
func (l *linkConn) echo(size int, wait time.Duration) (time.Duration, error) {
	t0 := time.Now()
	_ = l.c.SetDeadline(t0.Add(wait))
	line := strings.Repeat("x", size) + "\n"
	if _, err := l.c.Write([]byte(line)); err != nil {
		return 0, err
	}
	got, err := l.r.ReadString('\n')
	if err == nil && got != line {
		err = fmt.Errorf("echo of %d bytes came back as %d", len(line), len(got))
	}
	return time.Since(t0), err
}

// procState is the state letter of /proc/<pid>/stat: R, S, T (stopped)...
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return rest[:1]
}

// waitStopped waits up to 5 s for pid to be stopped (state T) or not.
func waitStopped(t *testing.T, pid int, stopped bool) {
	t.Helper()
	s := ""
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if s = procState(t, pid); (s == "T") == stopped {
			return
		}
	}
	t.Fatalf("pid %d in state %s, want stopped %v", pid, s, stopped)
}

// Every kind a schedule draws does what it says to what it targets, and
// healing it undoes it: latency with jitter, bandwidth caps, resets, one-
// way holds and partitions on links; SIGKILL (a NATS restart), SIGTERM
// and SIGSTOP/SIGCONT of processes; an engine restart that starts its seq
// again from 0, an engine freeze.
func TestEveryKindIsInjected(t *testing.T) {
	r := faultRun(t)
	ctx := context.Background()
	tested := map[Kind]bool{}
	apply := func(f Fault) func() {
		t.Helper()
		heal, err := r.apply(ctx, "f-"+string(f.Kind), f)
		if err != nil {
			t.Fatalf("apply %v: %v", f, err)
		}
		tested[f.Kind] = true
		return func() {
			t.Helper()
			if err := heal(); err != nil {
				t.Fatalf("heal %v: %v", f, err)
			}
		}
	}
	link := NATSLink(AgentName(0))

	t.Run("latency", func(t *testing.T) {
		c := dialLink(t, r, link)
		heal := apply(Fault{Kind: Latency, Targets: []string{link}, Stream: Downstream, Latency: 200 * time.Millisecond, Jitter: 50 * time.Millisecond})
		if d, err := c.echo(10, 5*time.Second); err != nil || d < 150*time.Millisecond {
			t.Fatalf("echo under 200±50 ms latency after %v: %v", d, err)
		}
		heal()
		if d, err := c.echo(10, 5*time.Second); err != nil || d > 100*time.Millisecond {
			t.Fatalf("echo after healing after %v: %v", d, err)
		}
	})
	t.Run("bandwidth", func(t *testing.T) {
		c := dialLink(t, r, link)
		heal := apply(Fault{Kind: Bandwidth, Targets: []string{link}, Stream: Downstream, RateKB: 32})
		if d, err := c.echo(32<<10, 10*time.Second); err != nil || d < 700*time.Millisecond {
			t.Fatalf("32 KB under a 32 KB/s cap echoed after %v: %v", d, err)
		}
		heal()
		if d, err := c.echo(32<<10, 5*time.Second); err != nil || d > 300*time.Millisecond {
			t.Fatalf("32 KB after healing echoed after %v: %v", d, err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		c := dialLink(t, r, link)
		heal := apply(Fault{Kind: Reset, Targets: []string{link}})
		if _, err := c.echo(10, 2*time.Second); err == nil {
			t.Fatal("a connection through a resetting link still echoes")
		}
		heal()
		if _, err := dialLink(t, r, link).echo(10, 2*time.Second); err != nil {
			t.Fatalf("a new connection after healing: %v", err)
		}
	})
	holds := func(t *testing.T, f Fault) {
		var cs []*linkConn
		for _, l := range f.Targets {
			cs = append(cs, dialLink(t, r, l))
		}
		heal := apply(f)
		for i, c := range cs {
			if _, err := c.echo(10, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("%s under %s: echo %v, want none", f.Targets[i], f.Kind, err)
			}
			_ = c.c.SetDeadline(time.Time{})
		}
		heal()
		for i, c := range cs {
			// What the hold kept arrives once it is healed.
			_ = c.c.SetDeadline(time.Now().Add(5 * time.Second))
			if got, err := c.r.ReadString('\n'); err != nil || got != strings.Repeat("x", 10)+"\n" {
				t.Fatalf("%s after healing %s: %q, %v", f.Targets[i], f.Kind, got, err)
			}
		}
	}
	t.Run("blackhole", func(t *testing.T) { holds(t, Fault{Kind: Blackhole, Targets: []string{link}, Stream: Upstream}) })
	t.Run("partition", func(t *testing.T) {
		holds(t, Fault{Kind: Partition, Targets: []string{NATSLink(AgentName(0)), NATSLink(ReplicaName(0))}})
	})
	t.Run("link_down", func(t *testing.T) {
		c := dialLink(t, r, link)
		heal := apply(Fault{Kind: LinkDown, Targets: []string{link}})
		if _, err := c.echo(10, 2*time.Second); err == nil {
			t.Fatal("a connection through a link that is down still echoes")
		}
		if c, err := net.Dial("tcp", r.net.Link(link).Listen); err == nil {
			c.Close()
			t.Fatal("a link that is down accepts connections")
		}
		heal()
		if _, err := dialLink(t, r, link).echo(10, 2*time.Second); err != nil {
			t.Fatalf("after healing: %v", err)
		}
	})
	restarts := func(t *testing.T, f Fault) {
		c := r.child(f.Targets[0])
		_, n, pid, _ := c.state()
		heal := apply(f)
		if live, _, _, _ := c.state(); live {
			t.Fatalf("%s still runs after %s", c.name, f.Kind)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("%s's pid %d after %s: %v, want no such process", c.name, pid, f.Kind, err)
		}
		heal()
		if live, n2, pid2, _ := c.state(); !live || n2 != n+1 || pid2 == pid {
			t.Fatalf("%s after healing %s: live %v, instance %d (was %d), pid %d (was %d)", c.name, f.Kind, live, n2, n, pid2, pid)
		}
	}
	t.Run("sigkill nats", func(t *testing.T) { restarts(t, Fault{Kind: SIGKILL, Targets: []string{NATS}}) })
	t.Run("sigterm replica", func(t *testing.T) { restarts(t, Fault{Kind: SIGTERM, Targets: []string{ReplicaName(0)}}) })
	t.Run("sigstop agent", func(t *testing.T) {
		c := r.child(AgentName(0))
		_, _, pid, _ := c.state()
		heal := apply(Fault{Kind: SIGSTOP, Targets: []string{c.name}})
		waitStopped(t, pid, true)
		if live, _, _, _ := c.state(); live {
			t.Fatal("a paused process counts as live")
		}
		heal()
		waitStopped(t, pid, false)
		if live, _, pid2, _ := c.state(); !live || pid2 != pid {
			t.Fatalf("after SIGCONT: live %v, pid %d (was %d)", live, pid2, pid)
		}
	})
	t.Run("engine", func(t *testing.T) { engineFaults(t, r, apply) })
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.violations) > 0 || len(r.harnessErrs) > 0 {
		t.Fatalf("violations %v, harness errors %v", r.violations, r.harnessErrs)
	}
	for _, k := range Kinds {
		if !tested[k] {
			t.Errorf("%s not injected", k)
		}
	}
}

// engineFaults checks an engine restart (seq from 0 again, an empty
// cache) and an engine freeze (no steps, its links holding).
func engineFaults(t *testing.T, r *run, apply func(Fault) func()) {
	e := r.engines[0]
	zctx, err := zmq4.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	sub, err := zctx.NewSocket(zmq4.SUB)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_ = sub.SetSubscribe("")
	_ = sub.SetRcvtimeo(5 * time.Second)
	_ = sub.SetLinger(0)
	if err := sub.Connect(tcpAddr(e.cfg.PubPort)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.WaitForSubscribers(ctx); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// steps runs n steps and returns the seq of each message received.
	steps := func(n int) []uint64 {
		var seqs []uint64
		for range n {
			if err := e.Step(time.Now()); err != nil {
				t.Fatal(err)
			}
			msg, err := sub.RecvMessageBytes(0)
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, binary.BigEndian.Uint64(msg[1]))
		}
		return seqs
	}
	if got := steps(5); got[4] != 4 {
		t.Fatalf("seqs %v before the restart", got)
	}
	if res, _, _ := e.Truth(); res == 0 {
		t.Fatal("engine holds nothing after 5 steps")
	}
	apply(Fault{Kind: EngineRestart, Targets: []string{EngineName(0)}, For: 100 * time.Millisecond})()
	if res, _, _ := e.Truth(); res != 0 || e.Stats().Restarts != 1 {
		t.Fatalf("after a restart: %d blocks, %d restarts", res, e.Stats().Restarts)
	}
	// An idle SUB socket subscribes to the new process only once its
	// thread calls into libzmq.
	for {
		_, _ = sub.RecvBytes(zmq4.DONTWAIT)
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := e.WaitForSubscribers(wctx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no subscriber after the restart: %v", err)
		}
	}
	if got := steps(3); got[0] != 0 || got[2] != 2 {
		t.Fatalf("seqs %v after the restart, want 0, 1, 2", got)
	}

	c := dialLink(t, r, PubLink(0))
	before := e.Stats().Steps
	heal := apply(Fault{Kind: EngineFreeze, Targets: []string{EngineName(0), PubLink(0), ReplayLink(0)}})
	if err := e.Step(time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := e.Stats().Steps; got != before {
		t.Fatalf("a frozen engine stepped: %d steps, was %d", got, before)
	}
	if _, err := c.echo(10, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a frozen engine's link: %v, want it holding", err)
	}
	heal()
	if got := steps(1); got[0] != 3 {
		t.Fatalf("seq %v after the freeze, want 3", got)
	}
}
