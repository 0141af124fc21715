package proc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Stop and Wait judge how a process ended: status 0 after SIGTERM,
// death by SIGKILL, a kill past the timeout, and the log file gets the
// process's output.
func TestProcessStopAndWait(t *testing.T) {
	start := func(script, log string) *Process {
		t.Helper()
		p, err := Start("test child", exec.Command("/bin/sh", "-c", script), log)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	log := filepath.Join(t.TempDir(), "child.log")
	p := start(`trap 'echo bye; exit 0' TERM; echo hello; while :; do sleep 0.01; done`, log)
	waitLog(t, log, "hello")
	if err := p.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("SIGTERM, trapped to exit 0: %v", err)
	}
	if !p.Stopping() {
		t.Error("Stopping false after Stop")
	}
	if b, _ := os.ReadFile(log); string(b) != "hello\nbye\n" {
		t.Errorf("log %q", b)
	}
	if err := start("sleep 60", "").Stop(syscall.SIGKILL, 10*time.Second); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	if err := start("sleep 60", "").Stop(syscall.SIGTERM, 10*time.Second); err == nil || !strings.Contains(err.Error(), "want exit status 0") {
		t.Fatalf("killed by SIGTERM: %v, want an error", err)
	}
	if err := start("exit 3", "").Wait(10 * time.Second); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("exit 3: %v", err)
	}
	p = start("sleep 60", "")
	if err := p.Wait(50 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("past the timeout: %v", err)
	}
	if p.Stopping() {
		t.Error("Stopping true without Stop")
	}
	if err := start("exit 0", "").Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func waitLog(t *testing.T, path, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile(path); strings.Contains(string(b), want) {
			return
		}
	}
	t.Fatalf("%s never had %q", path, want)
}

func TestParseStatus(t *testing.T) {
	status := "Name:\tkvindex\nVmPeak:\t  900 kB\nVmHWM:\t   20000 kB\nVmRSS:\t   12345 kB\nThreads:\t9\n"
	if m, err := parseStatus(status, 1); err != nil || m.RSS != 12345<<10 || m.Peak != 20000<<10 {
		t.Fatalf("%+v %v", m, err)
	}
	for _, bad := range []string{"Name:\tx\n", "VmRSS:\t12 MB\n", "VmRSS:\n", "VmRSS:\tlots kB\n"} {
		if _, err := parseStatus(bad, 1); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if m, err := Mem(os.Getpid()); err != nil || m.RSS <= 0 || m.Peak < m.RSS {
		t.Fatalf("own memory %+v %v", m, err)
	}
}

func TestParseStatCPU(t *testing.T) {
	stat := "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0"
	if d, err := parseStatCPU(stat, 42); err != nil || d != 3*time.Second {
		t.Fatalf("%v %v, want 3s", d, err)
	}
	for _, bad := range []string{"42 no name", "42 (x) S 1 2", "42 (x) S 1 2 3 4 5 6 7 8 9 10 x 50"} {
		if _, err := parseStatCPU(bad, 42); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if _, err := CPU(os.Getpid()); err != nil {
		t.Fatal(err)
	}
}

// WaitReady returns once ready succeeds, and fails naming the cause when
// the process exits first or the timeout passes.
func TestWaitReady(t *testing.T) {
	p, err := Start("sleeper", exec.Command("sleep", "60"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	calls := 0
	err = p.WaitReady(t.Context(), 10*time.Second, func(context.Context) error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("ready on the third call: %v after %d", err, calls)
	}
	notYet := func(context.Context) error { return errors.New("not yet") }
	if err := p.WaitReady(t.Context(), 150*time.Millisecond, notYet); err == nil || !strings.Contains(err.Error(), "not ready within") {
		t.Fatalf("past the timeout: %v", err)
	}
	q, err := Start("quitter", exec.Command("/bin/sh", "-c", "exit 2"), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := q.WaitReady(t.Context(), 10*time.Second, notYet); err == nil || !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "exit status 2") {
		t.Fatalf("exited: %v", err)
	}
}
