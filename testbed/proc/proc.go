// Package proc is the testbed's process harness: it builds binaries,
// starts child processes and stops them, reads what a process and the
// machine have used (CPU, memory, load) from /proc, and profiles and
// reports for the testbed's commands.
package proc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"
)

// Build compiles the package pkg (an import path) of the module in the
// current directory into dir with the go command goTool and returns the
// binary's path, named after the package's last element.
func Build(ctx context.Context, goTool, dir, pkg string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", bin, pkg)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("proc: %s build %s: %w\n%s", goTool, pkg, err, out.String())
	}
	return bin, nil
}

// Process is a started child process, waited for in the background. Its
// methods may be called from any goroutine.
type Process struct {
	Name string // in errors
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited

	mu       sync.Mutex
	err      error
	stopping bool
}

// Start starts cmd, named name in errors. With log not "", the process's
// stdout and stderr go to that file (created, closed at exit). On Linux
// the process is killed when this one exits, so that an interrupted run
// leaves no child holding its ports.
func Start(name string, cmd *exec.Cmd, log string) (*Process, error) {
	var f *os.File
	if log != "" {
		var err error
		if f, err = os.Create(log); err != nil {
			return nil, fmt.Errorf("proc: %s: log: %w", name, err)
		}
		cmd.Stdout, cmd.Stderr = f, f
	}
	setChildAttrs(cmd)
	if err := cmd.Start(); err != nil {
		if f != nil {
			f.Close()
		}
		return nil, fmt.Errorf("proc: start %s (%s): %w", name, cmd.Path, err)
	}
	p := &Process{Name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		if f != nil {
			f.Close()
		}
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the process's exit error (nil for status 0), valid after Done.
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Stopping reports whether Stop was called: an exit the caller asked for.
func (p *Process) Stopping() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopping
}

// WaitReady calls ready (with a second to answer) every 100 ms until it
// returns nil, and fails when the process exits first, ctx ends or
// timeout passes, with ready's last error.
func (p *Process) WaitReady(ctx context.Context, timeout time.Duration, ready func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := ready(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("proc: %s exited before it was ready: %v (last %w)", p.Name, p.Err(), err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proc: %s not ready within %v: %w", p.Name, timeout, err)
		}
	}
}

// Wait waits up to timeout for the process to exit and returns its exit
// error; past timeout it kills the process and says so.
func (p *Process) Wait(timeout time.Duration) error {
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.Kill()
		<-p.done
		return fmt.Errorf("proc: %s (pid %d) did not exit within %v; killed", p.Name, p.Pid(), timeout)
	}
	if err := p.Err(); err != nil {
		return fmt.Errorf("proc: %s (pid %d): %w", p.Name, p.Pid(), err)
	}
	return nil
}

// Stop sends sig and waits up to timeout for the process to exit (then
// kills it). A process sent SIGKILL must die of it; any other signal must
// leave it exiting with status 0.
func (p *Process) Stop(sig syscall.Signal, timeout time.Duration) error {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("proc: signal %s (pid %d) with %v: %w", p.Name, p.Pid(), sig, err)
	}
	err := p.Wait(timeout)
	if sig != syscall.SIGKILL || err == nil {
		if err != nil {
			return fmt.Errorf("%w after %v, want exit status 0", err, sig)
		}
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return nil
		}
	}
	return fmt.Errorf("%w after SIGKILL, want killed", err)
}

// Kill ends the process at once (on an error path); nil does nothing.
func (p *Process) Kill() {
	if p != nil {
		_ = p.cmd.Process.Kill()
	}
}

// StartCPUProfile starts a CPU profile of this process into path and
// returns the function that stops it, to be called once. With path "" it
// profiles nothing.
func StartCPUProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("proc: cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("proc: cpu profile %s: %w", path, err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// WriteJSON writes v as indented JSON, the form the testbed's commands
// print their reports in.
func WriteJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err == nil {
		_, err = fmt.Fprintf(w, "%s\n", b)
	}
	if err != nil {
		return fmt.Errorf("proc: write report: %w", err)
	}
	return nil
}
