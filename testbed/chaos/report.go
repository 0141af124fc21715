package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Invariants names the invariants a run checks, by their letter.
var Invariants = map[string]string{
	"a": "no answer credits a worker with a block its engine does not hold, beyond the measured event lag, unless it flags the worker or the block is speculative",
	"b": "after the faults, every replica and agent holds exactly its engines' caches within the bound, and a restarted agent resumes from its checkpoint",
	"c": "memory, goroutines and queue depths stay within their bounds, and no goroutines leak",
	"d": "no panic, no process exiting by itself or uncleanly, no deadlock",
}

// Violation is one broken invariant: which, what kind, when (since the
// fault phase began; negative before it), what exactly, and the faults
// in effect then.
type Violation struct {
	Invariant string        `json:"invariant"`
	Kind      string        `json:"kind"`
	At        time.Duration `json:"at_ns"`
	Detail    string        `json:"detail"`
	Faults    string        `json:"faults"`
}

func (v Violation) String() string {
	return fmt.Sprintf("(%s) %s at %.2fs: %s; faults in effect: %s", v.Invariant, v.Kind, v.At.Seconds(), v.Detail, v.Faults)
}

// maxKept is how many violations a summary keeps (all are counted).
const maxKept = 50

// violate records a violation of invariant inv observed now.
func (r *run) violate(inv, kind, format string, args ...any) {
	r.violateAt(inv, kind, time.Now(), format, args...)
}

// violateAt records a violation observed at at.
func (r *run) violateAt(inv, kind string, at time.Time, format string, args ...any) {
	v := Violation{Invariant: inv, Kind: kind, Detail: fmt.Sprintf(format, args...), Faults: r.activeFaults()}
	if !r.start.IsZero() {
		v.At = at.Sub(r.start)
	}
	r.log.Warn("violation", "invariant", inv, "kind", kind, "detail", v.Detail)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations = append(r.violations, v)
}

// Summary is one seed's result.
type Summary struct {
	Seed    uint64 `json:"seed"`
	Passed  bool   `json:"passed"`
	Replay  string `json:"replay"` // the command that runs this seed again
	Dir     string `json:"dir"`
	Elapsed string `json:"elapsed"`
	// First is the earliest violation; Violations the first maxKept by
	// time; ByInvariant counts them all.
	First       *Violation     `json:"first,omitempty"`
	Violations  []Violation    `json:"violations,omitempty"`
	ByInvariant map[string]int `json:"by_invariant,omitempty"`
	HarnessErrs []string       `json:"harness_errors,omitempty"`
	Schedule    []Fault        `json:"schedule"`
	Faults      map[Kind]int   `json:"faults"`          // applied, by kind
	ByClass     map[string]int `json:"faults_by_class"` // applied, by Fault.Class
	// Converged is how long the fleet took to equal the engines' caches
	// once the faults stopped (ConvergedOK false: it did not within the
	// bound).
	Converged   string            `json:"converged"`
	ConvergedOK bool              `json:"converged_ok"`
	Bounds      map[string]string `json:"bounds"`
	Checks      map[string]int64  `json:"checks"`
	Usage       map[string]*usage `json:"usage"`
	Engines     []EngineStats     `json:"engines"`
	// EndState is each agent's and replica's ListWorkers entry of each
	// worker once the fleet converged (or gave up), nonzero fields only.
	EndState map[string]json.RawMessage `json:"end_state,omitempty"`
}

// summary gathers the run's result.
func (r *run) summary(elapsed, converged time.Duration, ok bool) *Summary {
	checks := r.check.snapshot()
	var engines []EngineStats
	for _, e := range r.engines {
		engines = append(engines, e.Stats())
	}
	r.usage.mu.Lock()
	usage := r.usage.by
	r.usage.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &Summary{Seed: r.opts.Seed, Dir: r.dir, Elapsed: elapsed.Round(time.Millisecond).String(), Schedule: r.sched,
		Faults: map[Kind]int{}, ByInvariant: map[string]int{}, HarnessErrs: r.harnessErrs,
		Converged: converged.Round(time.Millisecond).String(), ConvergedOK: ok, Checks: checks, Usage: usage, Engines: engines,
		Bounds: map[string]string{"detect": r.bounds.Detect.String(), "converge": r.bounds.Converge.String(), "lag_window": lagWindow.String(),
			"rss": fmt.Sprintf("%d MiB", r.bounds.RSS>>20), "goroutines": strconv.Itoa(r.bounds.Goroutines), "leak": strconv.Itoa(r.bounds.Leak)},
		Replay: CommandLine(r.opts), EndState: r.end}
	maps.Copy(s.Faults, r.applied)
	s.ByClass = maps.Clone(r.appliedOn)
	for k, v := range r.counts {
		s.Checks[k] = v
	}
	s.Checks["nats_slow_consumers"] = r.slowConsumers
	vs := append([]Violation(nil), r.violations...)
	sort.SliceStable(vs, func(i, j int) bool { return vs[i].At < vs[j].At })
	for _, v := range vs {
		s.ByInvariant[v.Invariant]++
	}
	if len(vs) > 0 {
		s.First = &vs[0]
	}
	s.Violations = vs[:min(len(vs), maxKept)]
	s.Passed = len(vs) == 0 && len(r.harnessErrs) == 0
	return s
}

// CommandLine is the command that runs o's seed again, alone.
func CommandLine(o Options) string {
	return fmt.Sprintf("go run ./testbed/cmd/kvsoak chaos --seed %d --seeds 1 --duration %v --replicas %d", o.Seed, o.Duration, o.Replicas)
}

// Report writes a seed's result for a person: PASS or FAIL with its
// faults; on a failure, the first invariant broken, the others by
// invariant, the command that replays it, and its schedule.
func (s *Summary) Report(w io.Writer) {
	verdict := "PASS"
	if !s.Passed {
		verdict = "FAIL"
	}
	var kinds []string
	for _, k := range Kinds {
		if s.Faults[k] > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, s.Faults[k]))
		}
	}
	fmt.Fprintf(w, "chaos seed %d: %s in %s; %d faults (%s); converged %s after the faults; %d answers, %d credits checked\n",
		s.Seed, verdict, s.Elapsed, len(s.Schedule), strings.Join(kinds, ", "), s.Converged, s.Checks["answers"], s.Checks["credits"])
	if s.Passed {
		return
	}
	if s.First != nil {
		fmt.Fprintf(w, "  first invariant broken: %s\n  invariant (%s): %s\n", s.First, s.First.Invariant, Invariants[s.First.Invariant])
		fmt.Fprintf(w, "  violations by invariant: %v (%d kept in the summary)\n", s.ByInvariant, len(s.Violations))
	}
	for _, e := range s.HarnessErrs {
		fmt.Fprintf(w, "  harness error: %s\n", e)
	}
	fmt.Fprintf(w, "  replay: %s\n  logs: %s\n  schedule:\n", s.Replay, s.Dir)
	for _, f := range s.Schedule {
		fmt.Fprintf(w, "    %s\n", f)
	}
}

// Binaries are the programs a run starts: kvindex (built with the
// indexer's invariant checks) and nats-server.
type Binaries struct{ Kvindex, NATS string }

// Build compiles the binaries into dir with the go command goTool, from
// the module in the current directory: kvindex with the build tag
// invariants, so that a broken index panics where it breaks, and
// nats-server at the version go.mod requires.
func Build(ctx context.Context, goTool, dir string) (Binaries, error) {
	b := Binaries{Kvindex: filepath.Join(dir, "kvindex"), NATS: filepath.Join(dir, "nats-server")}
	for _, args := range [][]string{
		{"build", "-tags", "invariants", "-o", b.Kvindex, "./cmd/kvindex"},
		{"build", "-o", b.NATS, "github.com/nats-io/nats-server/v2"},
	} {
		cmd := exec.CommandContext(ctx, goTool, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return b, fmt.Errorf("chaos: %s %s: %w\n%s", goTool, strings.Join(args, " "), err, out.String())
		}
	}
	return b, nil
}

// Totals sum the seeds of one kvsoak chaos command.
type Totals struct {
	Seeds       int            `json:"seeds"`
	Passed      int            `json:"passed"`
	Failed      []uint64       `json:"failed_seeds"`
	Faults      map[Kind]int   `json:"faults"`
	ByClass     map[string]int `json:"faults_by_class"`
	Violations  map[string]int `json:"violations_by_invariant"`
	Answers     int64          `json:"answers_checked"`
	Credits     int64          `json:"credits_checked"`
	MaxConverge string         `json:"max_converged"`
	Summaries   []*Summary     `json:"summaries"`
}

// Total sums seeds' summaries.
func Total(sums []*Summary) *Totals {
	t := &Totals{Seeds: len(sums), Faults: map[Kind]int{}, ByClass: map[string]int{}, Violations: map[string]int{}, Summaries: sums}
	var conv time.Duration
	for _, s := range sums {
		if s.Passed {
			t.Passed++
		} else {
			t.Failed = append(t.Failed, s.Seed)
		}
		for k, v := range s.Faults {
			t.Faults[k] += v
		}
		for k, v := range s.ByClass {
			t.ByClass[k] += v
		}
		for k, v := range s.ByInvariant {
			t.Violations[k] += v
		}
		t.Answers += s.Checks["answers"]
		t.Credits += s.Checks["credits"]
		if d, err := time.ParseDuration(s.Converged); err == nil {
			conv = max(conv, d)
		}
	}
	t.MaxConverge = conv.String()
	return t
}
