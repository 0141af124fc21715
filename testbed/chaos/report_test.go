package chaos

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// A failing seed is a bug report: a deliberately wrong answer makes the
// seed fail, and its report names the first invariant broken (the
// earliest, not the first recorded), the command that replays the seed
// and the seed's whole schedule; the totals name the seed.
func TestFailingSeedIsABugReport(t *testing.T) {
	r := checkRun(t)
	r.violateAt("c", "memory", r.start.Add(3*time.Second), "replica-0 (instance 1) uses 300 MiB")
	never := make([]uint32, 4*BlockSize)
	sent := r.start.Add(time.Second)
	r.check.answer(0, "Score", never, sent, sent, answerFor(4, PodName(0), 2, 0, kvindexv1.WorkerHealth_WORKER_HEALTH_OK))
	r.applied[Latency], r.appliedOn["latency agent/nats"] = 2, 2
	s := r.summary(40*time.Second, time.Second, true)
	var b bytes.Buffer
	s.Report(&b)
	out := b.String()
	t.Log(out)
	for _, want := range []string{
		"chaos seed 42: FAIL in 40s; " + strconv.Itoa(len(r.sched)) + " faults (latency 2);",
		"\n  first invariant broken: (a) wrong_answer at 1.00s: Score answered by replica-0 0s after it was sent: pod-0 credited with 2 blocks (0 more speculative), health WORKER_HEALTH_OK; block 0 never held by its engine; faults in effect: none\n",
		"\n  invariant (a): " + Invariants["a"] + "\n",
		"\n  violations by invariant: map[a:1 c:1]",
		"\n  replay: go run ./testbed/cmd/kvsoak chaos --seed 42 --seeds 1 --duration 40s --replicas 1\n",
		"\n  schedule:\n    " + strings.ReplaceAll(strings.TrimSuffix(FormatSchedule(r.sched), "\n"), "\n", "\n    ") + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if len(r.sched) < 10 || s.Passed || s.First == nil || s.First.Invariant != "a" || s.ByInvariant["c"] != 1 {
		t.Fatalf("summary %+v", s)
	}
	tot := Total([]*Summary{s, {Seed: 43, Passed: true, Faults: map[Kind]int{Latency: 1}, ByClass: map[string]int{"latency agent/nats": 1}}})
	if tot.Seeds != 2 || tot.Passed != 1 || len(tot.Failed) != 1 || tot.Failed[0] != 42 || tot.Faults[Latency] != 3 ||
		tot.ByClass["latency agent/nats"] != 3 || tot.Violations["a"] != 1 {
		t.Fatalf("totals %+v", tot)
	}
}

// A passing seed reports one line: its faults and checks, no schedule.
func TestPassingSeedReport(t *testing.T) {
	r := checkRun(t)
	r.applied[SIGKILL] = 1
	s := r.summary(40*time.Second, 1500*time.Millisecond, true)
	var b bytes.Buffer
	s.Report(&b)
	want := "chaos seed 42: PASS in 40s; " + strconv.Itoa(len(r.sched)) + " faults (sigkill 1); converged 1.5s after the faults; 0 answers, 0 credits checked\n"
	if !s.Passed || b.String() != want {
		t.Fatalf("report %q, want %q", b.String(), want)
	}
}
