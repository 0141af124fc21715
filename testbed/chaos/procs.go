package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvindex/kvindex/testbed/proc"
)

// child is one process of the fleet (nats-server, an agent, a replica),
// started again with the same arguments after a fault that ended it.
// Each start is an instance with its own log, <name>.<instance>.log. An
// exit nobody asked for is reported through exited.
//
// # Concurrency
//
// mu guards the fields below it; the methods may be called from any
// goroutine, but the schedule gives a child one fault at a time.
type child struct {
	name, bin, dir string
	args           []string
	ready          func(context.Context) error
	exited         func(c *child, instance int, err error)

	mu       sync.Mutex
	p        *proc.Process
	instance int
	paused   bool
	down     bool // stopped by a fault, not started again yet
	quitting bool // the current instance was sent SIGQUIT by the watchdog
	// quitAsked is the current instance's own mark of that SIGQUIT, read
	// when it exits: the watchdog may start the next instance first.
	quitAsked *atomic.Bool
	started   time.Time
}

// logPath is the log of instance n.
func (c *child) logPath(n int) string {
	return filepath.Join(c.dir, fmt.Sprintf("%s.%d.log", c.name, n))
}

// start starts the next instance.
func (c *child) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.instance + 1
	cmd := exec.Command(c.bin, c.args...)
	// SIGQUIT, which the watchdog sends a process that stopped answering,
	// then dumps every goroutine.
	cmd.Env = append(os.Environ(), "GOTRACEBACK=all")
	p, err := proc.Start(fmt.Sprintf("%s (instance %d)", c.name, n), cmd, c.logPath(n))
	if err != nil {
		return err
	}
	quitAsked := new(atomic.Bool)
	c.p, c.instance, c.paused, c.down, c.quitting, c.quitAsked, c.started = p, n, false, false, false, quitAsked, time.Now()
	go func() {
		<-p.Done()
		c.mu.Lock()
		asked := p.Stopping() || quitAsked.Load()
		c.mu.Unlock()
		if !asked && c.exited != nil {
			c.exited(c, n, p.Err())
		}
	}()
	return nil
}

// waitReady waits up to timeout for the current instance to answer ready.
func (c *child) waitReady(ctx context.Context, timeout time.Duration) error {
	c.mu.Lock()
	p := c.p
	c.mu.Unlock()
	return p.WaitReady(ctx, timeout, c.ready)
}

// stop ends the current instance with sig (SIGKILL, or SIGTERM, after
// which it must exit with status 0); it stays down until start. A paused
// instance is resumed first, so that it can handle SIGTERM.
func (c *child) stop(sig syscall.Signal) error {
	c.mu.Lock()
	p, paused := c.p, c.paused
	c.down, c.paused = true, false
	c.mu.Unlock()
	if paused {
		_ = syscall.Kill(p.Pid(), syscall.SIGCONT)
	}
	return p.Stop(sig, 20*time.Second)
}

// pause stops the current instance with SIGSTOP (true) or resumes it
// with SIGCONT (false).
func (c *child) pause(on bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	sig := syscall.SIGCONT
	if on {
		sig = syscall.SIGSTOP
	}
	if err := syscall.Kill(c.p.Pid(), sig); err != nil {
		return fmt.Errorf("chaos: %v to %s (pid %d): %w", sig, c.name, c.p.Pid(), err)
	}
	c.paused = on
	return nil
}

// state says whether the current instance runs unpaused, which it is, its
// pid and since when it runs.
func (c *child) state() (live bool, instance, pid int, since time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p == nil {
		return false, 0, 0, time.Time{}
	}
	select {
	case <-c.p.Done():
		return false, c.instance, c.p.Pid(), c.started
	default:
	}
	return !c.paused && !c.down && !c.quitting, c.instance, c.p.Pid(), c.started
}

// quit sends the current instance SIGQUIT, which makes a Go process dump
// every goroutine to its log and exit, waits for it, and returns the log.
func (c *child) quit() (string, int, error) {
	c.mu.Lock()
	p, n := c.p, c.instance
	c.quitting = true
	c.quitAsked.Store(true)
	c.mu.Unlock()
	if err := syscall.Kill(p.Pid(), syscall.SIGQUIT); err != nil {
		return "", n, fmt.Errorf("chaos: SIGQUIT %s: %w", c.name, err)
	}
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		p.Kill()
		<-p.Done()
	}
	b, err := os.ReadFile(c.logPath(n))
	return string(b), n, err
}

// close ends the current instance at the end of a run: resumed if
// paused, then SIGTERM, which must end it with status 0.
func (c *child) close() error {
	c.mu.Lock()
	p, paused, down := c.p, c.paused, c.down
	c.down, c.paused = true, false
	c.mu.Unlock()
	if p == nil || down {
		return nil
	}
	if paused {
		_ = syscall.Kill(p.Pid(), syscall.SIGCONT)
	}
	select {
	case <-p.Done():
		return nil // reported when it exited
	default:
	}
	return p.Stop(syscall.SIGTERM, 20*time.Second)
}

// kill ends the current instance at once (an aborted run).
func (c *child) kill() {
	c.mu.Lock()
	p := c.p
	c.down = true
	c.mu.Unlock()
	if p != nil {
		_ = p.Stop(syscall.SIGKILL, 5*time.Second)
	}
}

// ScanLog reads a process's log and returns the first line that shows a
// crash: a Go panic, a fatal error, a data race, or kvindex's broken
// invariant assertion; "" if none.
func ScanLog(path string) (string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("chaos: read log: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") ||
			strings.Contains(line, "WARNING: DATA RACE") || strings.Contains(line, "broken invariant") {
			return line, nil
		}
	}
	return "", sc.Err()
}
