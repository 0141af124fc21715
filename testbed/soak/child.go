package soak

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BuildDaemon compiles cmd/kvindex of the module in the current directory
// into dir with the go command goTool and returns the binary's path.
func BuildDaemon(ctx context.Context, goTool, dir string) (string, error) {
	bin := filepath.Join(dir, "kvindex")
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", bin, "github.com/kvindex/kvindex/cmd/kvindex")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("soak: %s build ./cmd/kvindex: %w\n%s", goTool, err, out.String())
	}
	return bin, nil
}

// Child is one daemon process: `kvindex serve --config <file>`, its
// stderr and stdout in a log file of its own.
//
// # Concurrency
//
// Its methods may be called from any goroutine; Wait's result is kept.
type Child struct {
	// N numbers the process from 1.
	N   int
	cmd *exec.Cmd
	log string

	done    chan struct{} // closed when the process has exited
	mu      sync.Mutex
	exitErr error
	expect  bool // the soak asked it to exit
}

// StartChild starts bin serve --config config, logging to
// dir/daemon-<n>.log.
func StartChild(bin, config, dir string, n int) (*Child, error) {
	logPath := filepath.Join(dir, fmt.Sprintf("daemon-%d.log", n))
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("soak: daemon log: %w", err)
	}
	cmd := exec.Command(bin, "serve", "--config", config)
	cmd.Stdout, cmd.Stderr = f, f
	setChildAttrs(cmd)
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("soak: start %s serve --config %s: %w", bin, config, err)
	}
	c := &Child{N: n, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		f.Close()
		c.mu.Lock()
		c.exitErr = err
		c.mu.Unlock()
		close(c.done)
	}()
	return c, nil
}

// Pid is the process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// LogPath is the process's log file.
func (c *Child) LogPath() string { return c.log }

// Done is closed when the process has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Expected reports whether the soak asked the process to exit.
func (c *Child) Expected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.expect
}

// ExitErr is the process's exit error (nil for status 0), valid after Done.
func (c *Child) ExitErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exitErr
}

// Stop sends sig and waits up to timeout for the process to exit. With
// SIGTERM the daemon must drain and exit with status 0; with SIGKILL it
// dies at once. It returns what went wrong.
func (c *Child) Stop(sig syscall.Signal, timeout time.Duration) error {
	c.mu.Lock()
	c.expect = true
	c.mu.Unlock()
	if err := c.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("soak: signal daemon %d (pid %d) with %v: %w", c.N, c.Pid(), sig, err)
	}
	select {
	case <-c.done:
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("soak: daemon %d (pid %d) did not exit within %v of %v", c.N, c.Pid(), timeout, sig)
	}
	err := c.ExitErr()
	if sig == syscall.SIGKILL {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				return nil
			}
		}
		return fmt.Errorf("soak: daemon %d (pid %d) after SIGKILL: %v, want killed", c.N, c.Pid(), err)
	}
	if err != nil {
		return fmt.Errorf("soak: daemon %d (pid %d) after %v: %w, want exit status 0 (log %s)", c.N, c.Pid(), sig, err, c.log)
	}
	return nil
}

// RSS returns the process's VmRSS in bytes, from /proc/<pid>/status.
func (c *Child) RSS() (int64, error) {
	return ReadRSS(c.Pid())
}

// ReadRSS returns process pid's VmRSS in bytes.
func ReadRSS(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("soak: RSS of pid %d: %w", pid, err)
	}
	defer f.Close()
	return parseVmRSS(f, pid)
}

func parseVmRSS(r io.Reader, pid int) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("soak: RSS of pid %d: VmRSS line %q", pid, sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("soak: RSS of pid %d: VmRSS line %q: %w", pid, sc.Text(), err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("soak: RSS of pid %d: no VmRSS line", pid)
}

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat's times
// (100 on every architecture Linux supports today).
const clockTicks = 100

// ReadCPU returns the user plus system CPU seconds process pid has used,
// from /proc/<pid>/stat.
func ReadCPU(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("soak: CPU of pid %d: %w", pid, err)
	}
	return parseStatCPU(string(b), pid)
}

func parseStatCPU(stat string, pid int) (float64, error) {
	// The command name (field 2) is in parentheses and may hold spaces;
	// utime and stime are fields 14 and 15, the 12th and 13th after it.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("soak: CPU of pid %d: malformed stat %q", pid, clip(stat, 80))
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("soak: CPU of pid %d: stat has %d fields after the name", pid, len(f))
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	s, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("soak: CPU of pid %d: utime %q stime %q", pid, f[11], f[12])
	}
	return (u + s) / clockTicks, nil
}

// ScanLog reads a daemon log and returns how many lines were logged at
// level ERROR and the first line that shows a crash (a Go panic or fatal
// error), "" if none.
func ScanLog(path string) (errorLines int, crash string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", fmt.Errorf("soak: read daemon log: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `"level":"ERROR"`) {
			errorLines++
		}
		if crash == "" && (strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") || strings.Contains(line, "broken invariant")) {
			crash = line
		}
	}
	return errorLines, crash, sc.Err()
}

// Scrape fetches and parses http://addr/metrics.
func Scrape(ctx context.Context, client *http.Client, addr string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("soak: scrape %s: %w", addr, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("soak: scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("soak: scrape %s: %s", addr, resp.Status)
	}
	s, err := ParseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("soak: scrape %s: %w", addr, err)
	}
	return s, nil
}
