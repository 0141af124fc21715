package chaos

import (
	"bytes"
	"context"
	"errors"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"
)

// stuckOnLock blocks on mu until it is unlocked, then counts itself out.
func stuckOnLock(mu *sync.Mutex, started chan<- struct{}, n *int) {
	close(started)
	mu.Lock()
	*n++
	mu.Unlock()
}

// Stuck names a goroutine blocked on a mutex inside the module, by its
// function and place, from a real dump of this process.
func TestStuckNamesTheBlockedGoroutine(t *testing.T) {
	var mu sync.Mutex
	mu.Lock()
	started := make(chan struct{})
	n := 0
	go stuckOnLock(&mu, started, &n)
	<-started
	var dump []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
		if dump = Stuck(ParseGoroutines(b.String()), "github.com/kvindex/kvindex/testbed/chaos."); len(dump) > 0 {
			break
		}
	}
	mu.Unlock()
	if len(dump) != 1 || !strings.Contains(dump[0], "[sync.Mutex.Lock] in github.com/kvindex/kvindex/testbed/chaos.stuckOnLock (watchdog_test.go:") {
		t.Fatalf("stuck: %q", dump)
	}
}

// A SIGQUIT dump (with the runtime's gp= and m= fields and wait times)
// parses, and the longest wait comes first.
func TestParseSIGQUITDump(t *testing.T) {
	dump := `{"level":"INFO","msg":"started"}
SIGQUIT: quit
PC=0x47e0a1 m=0 sigcode=0

goroutine 0 gp=0x8c1a80 m=0 mp=0x8c2a40 [idle]:
runtime.futex(0x8c2b80, 0x80, 0x0)
	/usr/local/go/src/runtime/sys_linux_amd64.s:557 +0x21 fp=0x7ffd sp=0x7ffd pc=0x47e0a1

goroutine 12 gp=0xc000102000 m=nil [sync.Mutex.Lock, 1 minutes]:
sync.runtime_SemacquireMutex(0xc0000a4004?, 0x0?, 0x1?)
	/usr/local/go/src/runtime/sema.go:95 +0x25 fp=0xc0 sp=0xc0 pc=0x45
sync.(*Mutex).lockSlow(0xc0000a4000)
	/usr/local/go/src/sync/mutex.go:173 +0x15d fp=0xc0 sp=0xc0 pc=0x46
github.com/kvindex/kvindex/events/natsbus.(*replicaWorker).update(0xc0001, 0xc0002)
	/src/events/natsbus/replica_worker.go:120 +0x3a fp=0xc0 sp=0xc0 pc=0x47
github.com/kvindex/kvindex/events/natsbus.(*Source).onEntry(0xc0003)
	/src/events/natsbus/replica.go:272 +0x11 fp=0xc0 sp=0xc0 pc=0x48
created by github.com/kvindex/kvindex/events/natsbus.(*Source).Run in goroutine 1
	/src/events/natsbus/replica.go:150 +0x1

goroutine 13 gp=0xc000103000 m=nil [sync.Mutex.Lock, 3 minutes]:
github.com/kvindex/kvindex/fleet.(*Agent).WriteCheckpoint(0xc0004)
	/src/fleet/checkpoint.go:60 +0x3a

goroutine 14 gp=0xc000104000 m=nil [chan receive]:
github.com/kvindex/kvindex/fleet.(*Agent).Run(0xc0005)
	/src/fleet/agent.go:300 +0x3a
`
	gs := ParseGoroutines(dump)
	if len(gs) != 4 || gs[1].ID != "12" || gs[1].State != "sync.Mutex.Lock" || gs[1].Wait != "1 minutes" || len(gs[1].Frames) != 4 || len(gs[1].Places) != 4 {
		t.Fatalf("parsed %+v", gs)
	}
	got := Stuck(gs, "github.com/kvindex/kvindex/")
	want := []string{
		"goroutine 13 [sync.Mutex.Lock, 3 minutes] in github.com/kvindex/kvindex/fleet.(*Agent).WriteCheckpoint (checkpoint.go:60)",
		"goroutine 12 [sync.Mutex.Lock, 1 minutes] in github.com/kvindex/kvindex/events/natsbus.(*replicaWorker).update (replica_worker.go:120), called from github.com/kvindex/kvindex/events/natsbus.(*Source).onEntry (replica.go:272)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("stuck:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The harness's own loops are late once they miss their allowance.
func TestHeartbeats(t *testing.T) {
	var h heartbeats
	h.beat("fast", time.Hour)
	h.beat("slow", time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	if late := h.late(time.Now()); len(late) != 1 || !strings.HasPrefix(late[0], "slow (last progress") {
		t.Fatalf("late %q", late)
	}
	h.done("slow")
	if late := h.late(time.Now()); len(late) != 0 {
		t.Fatalf("late %q after done", late)
	}
}

// The watchdog dumps a process that stops answering (SIGQUIT), names the
// goroutine stuck on a lock in a violation of (d), and starts the
// process again.
func TestWatchdogNamesTheStuckGoroutine(t *testing.T) {
	r := faultRun(t)
	t.Setenv(childEnv, "stuck")
	c := &child{name: ReplicaName(1), bin: os.Args[0], dir: r.dir, args: []string{"-test.run=^$"}, exited: r.exited,
		ready: func(context.Context) error { return errors.New("no answer") }}
	if err := c.start(); err != nil {
		t.Fatal(err)
	}
	for _, other := range r.children() {
		other.kill()
	}
	r.nats, r.agents, r.replicas = nil, nil, []*child{c}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { r.watchProcesses(ctx); close(done) }()
	var v []Violation
	for ctx.Err() == nil && len(v) == 0 {
		time.Sleep(100 * time.Millisecond)
		r.mu.Lock()
		v = append([]Violation(nil), r.violations...)
		r.mu.Unlock()
	}
	cancel()
	<-done
	if len(v) != 1 || v[0].Invariant != "d" || v[0].Kind != "deadlock" ||
		!strings.Contains(v[0].Detail, "[sync.Mutex.Lock] in github.com/kvindex/kvindex/testbed/chaos.stuckOnLock (watchdog_test.go:") {
		t.Fatalf("violations %v, want a deadlock naming stuckOnLock", v)
	}
	if _, n, _, _ := c.state(); n != 2 {
		t.Fatalf("instance %d after the dump, want 2", n)
	}
}

// A process the watchdog sent SIGQUIT and started anew is not reported as
// exiting by itself, whichever of its exit and the next instance's start
// the harness sees first (the second used to clear the first's mark).
func TestQuitThenRestartIsNotAnExit(t *testing.T) {
	var mu sync.Mutex
	var exits []int
	c := &child{name: "sleeper", bin: "sleep", args: []string{"100"}, dir: t.TempDir(),
		exited: func(_ *child, n int, _ error) { mu.Lock(); exits = append(exits, n); mu.Unlock() }}
	if err := c.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.kill)
	for range 20 {
		if _, _, err := c.quit(); err != nil {
			t.Fatal(err)
		}
		if err := c.start(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(exits) != 0 {
		t.Fatalf("instances %v reported as exiting by themselves after SIGQUIT, want none", exits)
	}
}
