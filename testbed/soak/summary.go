package soak

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/proc"
)

// Summary is what a soak run did and found; JSON renders it. Its count
// maps leave out counts that are 0.
type Summary struct {
	// Passed is true when the run recorded no failure.
	Passed bool `json:"passed"`
	// Seed, Duration (seconds) and Dir (configuration, logs) of the run.
	Seed     uint64  `json:"seed"`
	Duration float64 `json:"duration_seconds"`
	Dir      string  `json:"dir"`
	// Command is the command line that reproduces the run.
	Command string `json:"command"`
	// LoadAvgStart and LoadAvgEnd are /proc/loadavg when the run started
	// and ended.
	LoadAvgStart string `json:"loadavg_start"`
	LoadAvgEnd   string `json:"loadavg_end"`

	// Engines sums the simulated engines' counters.
	Engines EngineSummary `json:"engines"`
	// Daemon counts the daemon processes and how they ended.
	Daemon DaemonSummary `json:"daemon"`
	// Index sums ListWorkers' counters of the same names (indexCounters)
	// over the soak's workers and every daemon process (each process's
	// last report); late_joins counts workers with a joined_at_seq.
	Index map[string]uint64 `json:"index"`
	// Checks counts checkpoint work: checkpoints run, scores_checked
	// (Score answers compared exactly), comparisons (worker answers
	// compared), wrong_answers (those that differed from the engine's true
	// cache) and resident_checks (worker block counts compared).
	Checks map[string]int64 `json:"checks"`
	// Load counts the gRPC load: scores, routes and releases answered
	// (released_false: a Release that found its request gone after a
	// daemon restart); invalid requests refused with InvalidArgument;
	// restart_errors, calls that failed during a daemon restart with a
	// code a restart causes; calls, the Score and Route calls sent, and
	// refused, those admission control refused for overload
	// (api.IsOverloaded: no failure unless more than MaxRefused of calls);
	// checkpoint_refused, checkpoint Scores refused and sent again; and
	// "health <h>", the workers in answers by health.
	Load map[string]int64 `json:"load"`
	// MaxRefused is the run's bound on Load.Refused, a fraction of
	// Load.Calls.
	MaxRefused float64 `json:"max_refused"`
	// Garbage counts hostile messages and connections sent, by kind.
	Garbage      map[string]int64 `json:"garbage"`
	GarbageTotal int64            `json:"garbage_total"`
	// Refusals are kvindex_push_refused_total by "listener reason", summed
	// over daemon processes.
	Refusals map[string]int64 `json:"refusals"`
	// OpenListenerWorkers is how many workers the open push listener had
	// created at the end (at most its max_workers).
	OpenListenerWorkers int `json:"open_listener_workers"`
	// RSS (bytes) and Goroutines are the daemon's samples.
	RSS        SeriesSummary `json:"rss_bytes"`
	Goroutines SeriesSummary `json:"goroutines"`
	// FailureCounts and Failures are every failure by kind and the first
	// few of each in detail.
	FailureCounts map[string]int64 `json:"failure_counts,omitempty"`
	Failures      []string         `json:"failures,omitempty"`
}

// indexCounters are the ListWorkers counters Summary.Index sums.
var indexCounters = []string{
	"batches", "events", "replays", "replayed_batches", "replay_continuations", "replay_failures", "stale_replays",
	"gaps", "missed_batches", "unrecovered_gaps", "duplicates", "restarts", "resets", "clears", "orphans",
	"unknown_blocks", "apply_errors",
}

// EngineSummary sums EngineStats over the fleet.
type EngineSummary struct {
	// Count is the number of engines.
	Count int `json:"count"`
	EngineStats
}

// DaemonSummary counts daemon processes.
type DaemonSummary struct {
	// Processes started; Terminated (SIGTERM, clean exit checked) and
	// Killed (SIGKILL) restarts; ErrorLogLines logged at level ERROR.
	Processes     int `json:"processes"`
	Terminated    int `json:"sigterm_restarts"`
	Killed        int `json:"sigkill_restarts"`
	ErrorLogLines int `json:"error_log_lines"`
	// CPUSeconds is the user and system CPU the processes used (as last
	// sampled).
	CPUSeconds float64 `json:"cpu_seconds"`
}

// SeriesSummary is a sampled series: First, Last and Max over every
// daemon process; Rule states the flatness rule and Verdict applies it to
// the last process's samples after its first passed checkpoint.
type SeriesSummary struct {
	Samples int         `json:"samples"`
	First   float64     `json:"first"`
	Last    float64     `json:"last"`
	Max     float64     `json:"max"`
	Rule    string      `json:"rule"`
	Verdict FlatVerdict `json:"final_process"`
}

// JSON writes the summary as indented JSON.
func (s *Summary) JSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("soak: write summary: %w", err)
	}
	return nil
}

// counter returns a ListWorkers counter by its field name in the proto.
func counter(w *kvindexv1.WorkerStatus, name string) uint64 {
	m := w.ProtoReflect()
	return m.Get(m.Descriptor().Fields().ByName(protoreflect.Name(name))).Uint()
}

// summary assembles the run's summary.
func (r *runner) summary(elapsed time.Duration, loadStart string) *Summary {
	s := &Summary{
		Seed: r.opts.Seed, Duration: elapsed.Seconds(), Dir: r.opts.Dir, Command: r.opts.commandLine(),
		LoadAvgStart: loadStart, LoadAvgEnd: loadAvg(), Index: map[string]uint64{},
		Garbage: r.garbage.counts.snapshot(), Refusals: map[string]int64{},
		Load: r.load.snapshot(), MaxRefused: r.opts.MaxRefused,
	}
	s.Engines.Count = len(r.engines)
	for _, e := range r.engines {
		e.Lock()
		st, sum := e.StatsLocked(), &s.Engines
		e.Unlock()
		sum.Steps += st.Steps
		sum.Lost += st.Lost
		sum.Events += st.Events
		sum.Stored += st.Stored
		sum.Removed += st.Removed
		sum.Clears += st.Clears
		sum.Restarts += st.Restarts
		sum.Requests += st.Requests
	}
	for _, v := range s.Garbage {
		s.GarbageTotal += v
	}
	r.mu.Lock()
	s.Daemon = DaemonSummary{Processes: r.process, Terminated: r.terminated, Killed: r.killed, ErrorLogLines: r.errorLines}
	for _, c := range r.cpu {
		s.Daemon.CPUSeconds += c
	}
	s.Index["late_joins"] = 0
	for _, ws := range r.lastWorkers {
		for _, w := range ws {
			if _, ok := r.byRef[refOf(w)]; !ok {
				continue
			}
			for _, name := range indexCounters {
				s.Index[name] += counter(w, name)
			}
			if w.GetJoinedAtSeq() > 0 {
				s.Index["late_joins"]++
			}
		}
	}
	for _, ms := range r.lastMetrics {
		ms.Each("kvindex_push_refused_total", func(l map[string]string, v float64) {
			s.Refusals[strings.TrimPrefix(l["listener"], "tcp://")+" "+l["reason"]] += int64(v)
		})
	}
	s.OpenListenerWorkers = countOn(r.lastWorkers[r.process], r.fleet.OpenPushAddr())
	r.mu.Unlock()
	s.RSS, _ = r.series(flatSeries[0].get, flatSeries[0].rule)
	s.Goroutines, _ = r.series(flatSeries[1].get, flatSeries[1].rule)
	s.Checks = r.checks.snapshot()
	s.FailureCounts, s.Failures = r.fail.Counts(), r.fail.Kept()
	s.Passed = r.fail.Count() == 0
	return s
}

// loadAvg returns /proc/loadavg's three load averages.
func loadAvg() string {
	l := proc.LoadAvg()
	return fmt.Sprintf("%.2f %.2f %.2f", l[0], l[1], l[2])
}
