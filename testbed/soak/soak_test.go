package soak

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/events"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42

kvindex_push_refused_total{listener="tcp://127.0.0.1:5557",reason="max_workers"} 7
kvindex_push_refused_total{listener="tcp://127.0.0.1:5557",reason="dp_rank"} 2 1700000000000
kvindex_push_refused_total{listener="tcp://127.0.0.1:6000",reason="max_workers"} 1
odd{a="x\"y\\z\nw",b=""} 1.5e3
`
	s, err := ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := Metric(s, "go_goroutines", nil); !ok || v != 42 {
		t.Fatalf("go_goroutines %v %v", v, ok)
	}
	if v, _ := Metric(s, "kvindex_push_refused_total", map[string]string{"reason": "max_workers"}); v != 8 {
		t.Fatalf("max_workers over both listeners %v, want 8", v)
	}
	if v, _ := Metric(s, "kvindex_push_refused_total", map[string]string{"listener": "tcp://127.0.0.1:5557", "reason": "dp_rank"}); v != 2 {
		t.Fatalf("dp_rank %v, want 2", v)
	}
	if v, ok := Metric(s, "absent", nil); ok || v != 0 {
		t.Fatal("absent metric found")
	}
	if v, ok := Metric(s, "odd", map[string]string{"a": "x\"y\\z\nw", "b": ""}); !ok || v != 1500 {
		t.Fatalf("escaped label: %v %v", v, ok)
	}
	for _, bad := range []string{"novalue\n", `m{a="x} 1` + "\n", `m{a=x} 1` + "\n", "m one\n", "m 1 2 3\n"} {
		if _, err := ParseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestFlatRule(t *testing.T) {
	rule := FlatRule{Ratio: 1.25, Slack: 10, MinSamples: 6}
	for _, tc := range []struct {
		name    string
		samples []float64
		flat    bool
	}{
		{"steady", []float64{100, 101, 99, 100, 102, 100, 101, 100, 99}, true},
		{"start-up peak then steady", []float64{300, 150, 120, 110, 110, 112, 111, 110, 109}, true},
		{"sawtooth", []float64{100, 130, 100, 130, 100, 130, 100, 130, 100}, true},
		{"within slack", []float64{10, 10, 10, 10, 10, 10, 22, 22, 22}, true},
		{"leak", []float64{100, 110, 120, 130, 140, 150, 160, 170, 180}, false},
		{"late jump", []float64{100, 100, 100, 100, 100, 100, 100, 100, 136}, false},
	} {
		v, err := rule.Judge(tc.samples)
		if err != nil {
			t.Fatal(err)
		}
		if v.Flat != tc.flat {
			t.Errorf("%s: %+v, want flat %v", tc.name, v, tc.flat)
		}
	}
	if _, err := rule.Judge([]float64{1, 2, 3}); err == nil {
		t.Error("3 samples judged with MinSamples 6")
	}
}

func TestScanLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.log")
	log := `{"level":"INFO","msg":"kvindex serving"}
{"level":"ERROR","msg":"x"}
{"level":"WARN","msg":"y"}
panic: runtime error: index out of range
`
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	n, crash, err := ScanLog(path)
	if err != nil || n != 1 || !strings.HasPrefix(crash, "panic: runtime error") {
		t.Fatalf("errors %d crash %q err %v", n, crash, err)
	}
}

// The fleet's configuration is one the daemon accepts, lists every
// worker the soak checks, and keeps the neighbour ports apart from the
// pods' own.
func TestFleetConfig(t *testing.T) {
	f, err := NewFleet()
	if err != nil {
		t.Fatal(err)
	}
	text, err := f.YAML()
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	ws := c.Workers()
	if len(ws) != 5 {
		t.Fatalf("%d pull workers, want 5", len(ws))
	}
	if len(c.Push) != 2 || c.Push[0].MaxWorkers != OpenMaxWorkers || len(c.Push[1].Allow) != 1 || len(c.Push[1].Routes) != 1 {
		t.Fatalf("push listeners: %+v", c.Push)
	}
	all := f.Workers()
	if len(all[ModelA]) != 4 || len(all[ModelB]) != 2 {
		t.Fatalf("workers by model: %v", all)
	}
	specs := f.Engines()
	if len(specs) != 6 {
		t.Fatalf("%d engines, want 6", len(specs))
	}
	ports := map[string]bool{}
	for _, s := range specs {
		for _, ep := range []string{s.Endpoint, s.ReplayEndpoint} {
			if ports[ep] {
				t.Fatalf("endpoint %s used twice", ep)
			}
			ports[ep] = true
		}
	}
	pub, rep := f.Neighbours()
	for _, ep := range append(pub, rep...) {
		if ports[ep] {
			t.Fatalf("neighbour %s is an engine's endpoint", ep)
		}
		for _, w := range ws {
			if w.Endpoint == ep || w.ReplayEndpoint == ep {
				t.Fatalf("neighbour %s is configured for %s", ep, w.Worker)
			}
		}
	}
}

func TestWindow(t *testing.T) {
	var w Window
	m := w.Mark()
	if w.Overlaps(m) {
		t.Fatal("a call with no restart overlaps one")
	}
	w.Begin()
	if !w.Overlaps(m) {
		t.Fatal("a call during a restart does not overlap it")
	}
	in := w.Mark()
	w.End()
	if !w.Overlaps(in) || !w.Overlaps(m) {
		t.Fatal("calls that spanned a restart do not overlap it")
	}
	if after := w.Mark(); w.Overlaps(after) {
		t.Fatal("a call after the restart overlaps it")
	}
}

func TestFailures(t *testing.T) {
	var f Failures
	for i := range MaxKept + 3 {
		f.Add("wrong_answer", "n %d", i)
	}
	f.Add("other", "x")
	if f.Count() != MaxKept+4 || len(f.Kept()) != MaxKept+1 || f.Counts()["wrong_answer"] != MaxKept+3 {
		t.Fatalf("count %d kept %d counts %v", f.Count(), len(f.Kept()), f.Counts())
	}
	if s := f.String(); s != "other=1 wrong_answer=8" {
		t.Fatalf("String %q", s)
	}
}

// Daemon restarts fall in the first 60% with the last one a SIGKILL, and
// no engine restarts twice within the transport's 10 s bounce window
// (three seq drops there read as two publishers).
func TestSchedule(t *testing.T) {
	opts := DefaultOptions()
	acts := schedule(opts.Duration, daemonRestarts, 6, opts.Seed)
	var daemon []action
	last := map[int]time.Duration{}
	for i, a := range acts {
		if i > 0 && a.at < acts[i-1].at {
			t.Fatal("schedule out of order")
		}
		if a.daemon {
			daemon = append(daemon, a)
			continue
		}
		if prev, ok := last[a.engine]; ok && a.at-prev < 10*time.Second {
			t.Fatalf("engine %d restarts %v apart", a.engine, a.at-prev)
		}
		last[a.engine] = a.at
	}
	if len(daemon) != 2 || daemon[0].sig != syscall.SIGTERM || daemon[1].sig != syscall.SIGKILL || daemon[1].at > opts.Duration*6/10 {
		t.Fatalf("daemon restarts %+v", daemon)
	}
	if len(last) != 6 {
		t.Fatalf("%d engines restarted, want all 6", len(last))
	}
	for _, a := range schedule(opts.Duration, 1, 6, opts.Seed) {
		if a.daemon && a.sig != syscall.SIGKILL {
			t.Fatalf("a single daemon restart is %v, want SIGKILL", a.sig)
		}
	}
}

// An engine over real sockets: a lost last message is flushed by one
// that is sent, and a restart starts again from seq 0 with an empty
// cache.
func TestEngineFlushAndRestart(t *testing.T) {
	f, err := NewFleet()
	if err != nil {
		t.Fatal(err)
	}
	spec := f.Engines()[0]
	opts := DefaultEngineOptions()
	opts.LossRate = 1 // every step starts a loss
	e, err := NewEngine(spec, opts, 1, 0, SystemPrompts(1, spec.Model, BlockSizeOf(spec.Model), 2))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for range 5 {
		if err := e.Step(); err != nil {
			t.Fatal(err)
		}
	}
	e.Lock()
	if seq, ok := e.LastSeqLocked(); !ok || seq != 4 || !e.lastLost {
		t.Fatalf("last seq %d %v lost %v", seq, ok, e.lastLost)
	}
	if err := e.FlushLocked(); err != nil {
		t.Fatal(err)
	}
	if seq, _ := e.LastSeqLocked(); seq != 5 || e.lastLost {
		t.Fatalf("after flush: seq %d lost %v", seq, e.lastLost)
	}
	if e.CacheLocked().Resident() == 0 || len(e.RecentLocked()) == 0 {
		t.Fatal("steps cached nothing")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nobody subscribes: do not wait
	if err := e.RestartLocked(ctx, 0); err == nil || !strings.Contains(err.Error(), "subscribers") {
		t.Fatalf("restart without a subscriber: %v", err)
	}
	if _, sent := e.LastSeqLocked(); sent || e.CacheLocked().Resident() != 0 || e.SinceRestartLocked() != 0 {
		t.Fatal("restart kept the old process's state")
	}
	if err := e.FlushLocked(); err != nil {
		t.Fatal(err)
	}
	if seq, _ := e.LastSeqLocked(); seq != 0 {
		t.Fatalf("new process's first seq %d, want 0", seq)
	}
	if st := e.StatsLocked(); st.Restarts != 1 || st.Steps != 7 {
		t.Fatalf("stats %+v", st)
	}
	e.Unlock()
	if e.Spec().Worker != (events.WorkerRef{Pod: "pod-a"}) {
		t.Fatalf("first engine %s", e.Spec().Worker)
	}
}

// The summary's command line repeats what changes the run, with the seed.
func TestCommandLine(t *testing.T) {
	opts := DefaultOptions()
	opts.Duration, opts.WarmupSteps = 15*time.Second, 0
	if got, want := opts.commandLine(), "kvsoak --duration 15s --warmup-steps 0 --seed 1"; got != want {
		t.Fatalf("command line %q, want %q", got, want)
	}
}
