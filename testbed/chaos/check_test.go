package chaos

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// checkRun is a run of seed 42 with one engine and one replica, its
// fault phase begun, for the checks alone: no process, no link.
func checkRun(t *testing.T) *run {
	t.Helper()
	p := DefaultPlan(Shape{Engines: 1, Replicas: 1}, 40*time.Second)
	dir := t.TempDir()
	r := &run{opts: Options{Seed: 42, Duration: p.Duration, Replicas: 1, Dir: dir}, log: slog.New(slog.DiscardHandler), dir: dir,
		plan: p, bounds: DefaultBounds(p), sched: Schedule(42, p), lay: &Layout{Replicas: make([]ProcPorts, 1)},
		engines: []*Engine{newTestEngine(t, 0)}, applied: map[Kind]int{}, appliedOn: map[string]int{}, active: map[int]Fault{}, counts: map[string]int64{}}
	r.check = newChecker(r)
	r.start = time.Now()
	return r
}

// served has engine 0 serve a prompt of its own (4 blocks) and returns it.
func served(t *testing.T, e *Engine, first uint32) []uint32 {
	t.Helper()
	p := make([]uint32, 4*BlockSize)
	for i := range p {
		p[i] = first + uint32(i)
	}
	e.Submit(p)
	for range 3 {
		if err := e.Step(time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.LongestPrefix(p); n != 4 {
		t.Fatalf("engine holds %d of the prompt's 4 blocks", n)
	}
	return p
}

// answerFor is a replica's answer crediting pod with matched blocks of
// a prompt of blocks, spec of them speculative, with the pod's health.
func answerFor(blocks int, pod string, matched, spec int, h kvindexv1.WorkerHealth) *kvindexv1.ScoreResponse {
	return &kvindexv1.ScoreResponse{PromptBlocks: uint32(blocks), Workers: []*kvindexv1.WorkerScore{{
		Worker: &kvindexv1.WorkerRef{Pod: pod}, MatchedBlocks: uint32(matched), SpeculativeBlocks: uint32(spec), Health: h}}}
}

// lagFamily is a replica's kvindex_event_lag_seconds of source nats with
// n observations, all in the bucket up to ub seconds.
func lagFamily(ub float64, n uint64) *dto.MetricFamily {
	var buckets []*dto.Bucket
	cum := uint64(0)
	for _, b := range []float64{0.1, 1, 10, 60} {
		if b >= ub {
			cum = n
		}
		buckets = append(buckets, &dto.Bucket{UpperBound: proto.Float64(b), CumulativeCount: proto.Uint64(cum)})
	}
	return &dto.MetricFamily{Name: proto.String("kvindex_event_lag_seconds"), Metric: []*dto.Metric{{
		Label:     []*dto.LabelPair{{Name: proto.String("source"), Value: proto.String("nats")}},
		Histogram: &dto.Histogram{SampleCount: proto.Uint64(n), Bucket: buckets},
	}}}
}

// Invariant (a), answer by answer: a credit of blocks the engine holds
// passes; of blocks it never held fails at once unless the answer flags
// the worker or the blocks are speculative; of blocks it dropped passes
// within the detection bound, and past it only when the replica's
// measured lag, scraped after the answer, covers it. Answers naming a
// worker the fleet lacks or more blocks than the prompt has fail.
func TestCheckerJudgesEveryCredit(t *testing.T) {
	r := checkRun(t)
	c, e := r.check, r.engines[0]
	ok := kvindexv1.WorkerHealth_WORKER_HEALTH_OK
	held := served(t, e, 1000)
	never := make([]uint32, 4*BlockSize) // zeros: a prompt nobody sent
	violations := func() []Violation {
		r.mu.Lock()
		defer r.mu.Unlock()
		return append([]Violation(nil), r.violations...)
	}
	now := time.Now()
	c.answer(0, "Score", held, now, now, answerFor(4, PodName(0), 4, 0, ok))
	c.answer(0, "Score", never, now, now, answerFor(4, PodName(0), 2, 2, ok))
	c.answer(0, "Score", never, now, now, answerFor(4, PodName(0), 3, 0, kvindexv1.WorkerHealth_WORKER_HEALTH_RECOVERING))
	if v := violations(); len(v) > 0 {
		t.Fatalf("held, speculative and flagged credits: %v", v)
	}
	c.answer(0, "Score", never, now, now, answerFor(4, PodName(0), 1, 0, ok))
	c.answer(0, "Score", held, now, now, answerFor(4, "pod-9", 1, 0, ok))
	c.answer(0, "Score", held, now, now, answerFor(3, PodName(0), 5, 0, ok))
	v := violations()
	if len(v) != 4 || v[0].Kind != "wrong_answer" || v[1].Kind != "unknown_worker" || v[2].Kind != "insane_answer" || v[3].Kind != "insane_answer" {
		t.Fatalf("violations %v, want wrong_answer, unknown_worker and two insane_answer", v)
	}
	if !strings.Contains(v[0].Detail, "never held by its engine") || v[0].Invariant != "a" {
		t.Fatalf("wrong answer reported as %v", v[0])
	}
	r.violations = nil

	// The engine restarts: every block dropped at dropped.
	dropped := time.Now()
	if err := e.Restart(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	within := dropped.Add(r.bounds.Detect / 2)
	c.answer(0, "Score", held, within, within, answerFor(4, PodName(0), 4, 0, ok))
	late := dropped.Add(r.bounds.Detect + 2*time.Second)
	c.answer(0, "Route", held, late, late, answerFor(4, PodName(0), 4, 0, ok))
	// The replica measures a lag of up to 10 s after that answer.
	c.observeLag(0, 1, lagFamily(0.1, 5), late.Add(-time.Second))
	c.observeLag(0, 1, lagFamily(10, 6), late.Add(time.Second))
	c.resolve(late.Add(2*time.Second), false)
	later := late.Add(5 * time.Second)
	c.answer(0, "Score", held, later, later, answerFor(4, PodName(0), 2, 0, ok))
	c.resolve(later.Add(time.Second), false)
	if v := violations(); len(v) > 0 {
		t.Fatalf("credits within the detection bound or the measured lag: %v", v)
	}
	c.resolve(later.Add(time.Second), true) // no lag measured after the last
	v = violations()
	if len(v) != 1 || v[0].Invariant != "a" || v[0].Kind != "wrong_answer" || !strings.Contains(v[0].Detail, "beyond the detection bound") {
		t.Fatalf("a credit stale beyond the bound and the lag: %v", v)
	}
	got := c.snapshot()
	for k, want := range map[string]int64{"answers": 9, "credits": 6, "credits_held": 1, "credits_flagged": 1,
		"credits_within_detect": 1, "credits_within_lag": 1, "max_measured_lag_bucket_ms": 10000} {
		if got[k] != want {
			t.Errorf("%s = %d, want %d (all: %v)", k, got[k], want, got)
		}
	}
}

// Invariant (c)'s leak check: a process sampled in one instance from
// the start that gained more than Bounds.Leak goroutines fails, named; a
// restarted one (its first samples were of another instance) and
// nats-server are not judged.
func TestLeakCheck(t *testing.T) {
	r := checkRun(t)
	r.record(ReplicaName(0), 1, 50<<20, 40, 0)
	r.record(ReplicaName(0), 1, 60<<20, 40+r.bounds.Leak+1, 3)
	r.record(AgentName(0), 1, 50<<20, 40, 0)
	r.record(AgentName(0), 2, 50<<20, 400, 0)
	r.record(AgentName(1), 1, 50<<20, 40, 0)
	r.record(AgentName(1), 1, 50<<20, 40+r.bounds.Leak, 0)
	r.record(NATS, 1, 50<<20, 0, 0)
	r.checkLeaks()
	if len(r.violations) != 1 || r.violations[0].Invariant != "c" || r.violations[0].Kind != "goroutine_leak" ||
		!strings.HasPrefix(r.violations[0].Detail, "replica-0 ran 81 goroutines after the faults, 40 when they began") {
		t.Fatalf("violations %v", r.violations)
	}
	if u := r.usage.by[ReplicaName(0)]; u.MaxRSS != 60<<20 || u.MaxGoroutines != 81 || u.MaxBacklog != 3 || u.Samples != 2 {
		t.Fatalf("replica-0's usage %+v", u)
	}
}
