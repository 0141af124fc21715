package soak

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/proc"
)

// Summary is what a soak run did and found; JSON renders it, leaving out
// counts that are 0. Command reproduces the run; Dir holds its
// configuration and logs; LoadAvgStart and LoadAvgEnd are /proc/loadavg
// around it.
//
// Index sums ListWorkers' counters of the same names (indexCounters) over
// the soak's workers and each daemon process's last report; late_joins
// counts workers with a joined_at_seq. Checks counts checkpoints,
// scores_checked (Score answers compared exactly), comparisons (worker
// answers compared), wrong_answers and resident_checks. Load counts
// scores, routes and releases answered (released_false: a Release that
// found its request gone after a daemon restart), invalid (refused with
// InvalidArgument), restart_errors (calls failed with a code a restart
// causes, during one), calls (Score and Route), refused (for overload: no
// failure unless more than MaxRefused of calls), checkpoint_refused (sent
// again) and "health <h>" (workers in answers by health). Refusals are
// kvindex_push_refused_total by "listener reason". Failures keeps the
// first few of each kind in detail.
type Summary struct {
	Passed       bool    `json:"passed"`
	Seed         uint64  `json:"seed"`
	Duration     float64 `json:"duration_seconds"`
	Dir          string  `json:"dir"`
	Command      string  `json:"command"`
	LoadAvgStart string  `json:"loadavg_start"`
	LoadAvgEnd   string  `json:"loadavg_end"`

	Engines             EngineSummary     `json:"engines"`
	Daemon              DaemonSummary     `json:"daemon"`
	Index               map[string]uint64 `json:"index"`
	Checks              map[string]int64  `json:"checks"`
	Load                map[string]int64  `json:"load"`
	MaxRefused          float64           `json:"max_refused"`
	Garbage             map[string]int64  `json:"garbage"` // hostile messages and connections by kind
	GarbageTotal        int64             `json:"garbage_total"`
	Refusals            map[string]int64  `json:"refusals"`
	OpenListenerWorkers int               `json:"open_listener_workers"` // at the end
	RSS                 SeriesSummary     `json:"rss_bytes"`
	Goroutines          SeriesSummary     `json:"goroutines"`
	FailureCounts       map[string]int64  `json:"failure_counts,omitempty"`
	Failures            []string          `json:"failures,omitempty"`
}

// indexCounters are the ListWorkers counters Summary.Index sums.
var indexCounters = []string{
	"batches", "events", "replays", "replayed_batches", "replay_continuations", "replay_failures", "stale_replays",
	"gaps", "missed_batches", "unrecovered_gaps", "duplicates", "restarts", "resets", "clears", "orphans",
	"unknown_blocks", "apply_errors",
}

// EngineSummary sums EngineStats over the fleet's Count engines.
type EngineSummary struct {
	Count int `json:"count"`
	EngineStats
}

// DaemonSummary counts the daemon processes started, their SIGTERM
// (clean exit checked) and SIGKILL restarts, the lines they logged at
// level ERROR and the CPU they used (as last sampled).
type DaemonSummary struct {
	Processes     int     `json:"processes"`
	Terminated    int     `json:"sigterm_restarts"`
	Killed        int     `json:"sigkill_restarts"`
	ErrorLogLines int     `json:"error_log_lines"`
	CPUSeconds    float64 `json:"cpu_seconds"`
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

// counter returns a ListWorkers counter by its field name in the proto.
func counter(w *kvindexv1.WorkerStatus, name string) uint64 {
	m := w.ProtoReflect()
	return m.Get(m.Descriptor().Fields().ByName(protoreflect.Name(name))).Uint()
}

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

func loadAvg() string {
	l := proc.LoadAvg()
	return fmt.Sprintf("%.2f %.2f %.2f", l[0], l[1], l[2])
}
