package soak

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/kvindex/kvindex/testbed/proc"
)

// Summary is what a soak run did and found; WriteText and JSON render it.
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
	// Index sums what the daemon's ListWorkers reported for the soak's
	// workers, over every daemon process (each process's last report).
	Index IndexSummary `json:"index"`
	// Checks counts the checkpoint comparisons.
	Checks CheckSummary `json:"checks"`
	// Load counts the gRPC load.
	Load LoadStats `json:"load"`
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
	FailureCounts map[string]int `json:"failure_counts,omitempty"`
	Failures      []string       `json:"failures,omitempty"`
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

// IndexSummary sums ListWorkers counters of the soak's workers.
type IndexSummary struct {
	// The fields are ListWorkers' counters of the same names; LateJoins
	// counts workers with a joined_at_seq.
	Batches             uint64 `json:"batches"`
	Events              uint64 `json:"events"`
	Replays             uint64 `json:"replays"`
	ReplayedBatches     uint64 `json:"replayed_batches"`
	ReplayContinuations uint64 `json:"replay_continuations"`
	ReplayFailures      uint64 `json:"replay_failures"`
	StaleReplays        uint64 `json:"stale_replays"`
	Gaps                uint64 `json:"gaps"`
	MissedBatches       uint64 `json:"missed_batches"`
	UnrecoveredGaps     uint64 `json:"unrecovered_gaps"`
	Duplicates          uint64 `json:"duplicates"`
	Restarts            uint64 `json:"restarts"`
	Resets              uint64 `json:"resets"`
	Clears              uint64 `json:"clears"`
	Orphans             uint64 `json:"orphans"`
	UnknownBlocks       uint64 `json:"unknown_blocks"`
	ApplyErrors         uint64 `json:"apply_errors"`
	LateJoins           uint64 `json:"late_joins"`
}

// CheckSummary counts checkpoint work.
type CheckSummary struct {
	// Checkpoints run; ScoresChecked Score calls compared exactly;
	// Comparisons worker answers compared; WrongAnswers those that
	// differed from the engine's true cache; ResidentChecks worker block
	// counts compared.
	Checkpoints    int64 `json:"checkpoints"`
	ScoresChecked  int64 `json:"scores_checked"`
	Comparisons    int64 `json:"comparisons"`
	WrongAnswers   int64 `json:"wrong_answers"`
	ResidentChecks int64 `json:"resident_checks"`
}

// SeriesSummary is a sampled series: over all samples, and the flatness
// verdict over the last daemon process's.
type SeriesSummary struct {
	// Samples, First, Last and Max are over every daemon process; Rule
	// states the flatness rule and Verdict applies it to the last
	// process's samples after its first passed checkpoint.
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

// WriteText writes the summary for a terminal.
func (s *Summary) WriteText(w io.Writer) error {
	var b strings.Builder
	verdict := "PASS"
	if !s.Passed {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "kvsoak %s: %.0fs, seed %d (%s)\n", verdict, s.Duration, s.Seed, s.Command)
	fmt.Fprintf(&b, "  loadavg            start %s | end %s\n", s.LoadAvgStart, s.LoadAvgEnd)
	e := s.Engines
	fmt.Fprintf(&b, "  engines            %d: %d batches (%d lost, replayed), %d events (%d blocks stored, %d removed), %d clears, %d requests, %d engine restarts\n",
		e.Count, e.Steps, e.Lost, e.Events, e.Stored, e.Removed, e.Clears, e.Requests, e.Restarts)
	fmt.Fprintf(&b, "  daemon             %d processes: %d SIGTERM and %d SIGKILL restarts; %d ERROR log lines; %.1f CPU seconds\n", s.Daemon.Processes, s.Daemon.Terminated, s.Daemon.Killed, s.Daemon.ErrorLogLines, s.Daemon.CPUSeconds)
	x := s.Index
	fmt.Fprintf(&b, "  index (ListWorkers) %d batches, %d events; %d replays (%d batches, %d continuations, %d failed, %d stale); %d gaps (%d batches, %d unrecovered); %d late joins\n",
		x.Batches, x.Events, x.Replays, x.ReplayedBatches, x.ReplayContinuations, x.ReplayFailures, x.StaleReplays, x.Gaps, x.MissedBatches, x.UnrecoveredGaps, x.LateJoins)
	fmt.Fprintf(&b, "                     %d restarts, %d resets, %d clears, %d duplicates, %d orphans, %d unknown blocks, %d apply errors\n", x.Restarts, x.Resets, x.Clears, x.Duplicates, x.Orphans, x.UnknownBlocks, x.ApplyErrors)
	c := s.Checks
	fmt.Fprintf(&b, "  checkpoints        %d: %d scores checked exactly, %d worker comparisons, %d wrong; %d resident counts compared\n", c.Checkpoints, c.ScoresChecked, c.Comparisons, c.WrongAnswers, c.ResidentChecks)
	l := s.Load
	fmt.Fprintf(&b, "  load               %d scores, %d routes, %d releases (%d after a restart found nothing), %d invalid refused, %d errors during restarts\n", l.Scores, l.Routes, l.Releases, l.ReleasedFalse, l.Invalid, l.RestartErrors)
	fmt.Fprintf(&b, "  overload refusals  %d of %d Score and Route calls (%.2f%%, limit %.1f%%); %d checkpoint Scores refused and sent again\n", l.Refused, l.Calls, 100*float64(l.Refused)/float64(max(l.Calls, 1)), 100*s.MaxRefused, l.CheckpointRefused)
	fmt.Fprintf(&b, "  answers by health  %s\n", formatCounts(l.Health))
	fmt.Fprintf(&b, "  garbage            %d sent: %s\n", s.GarbageTotal, formatCounts(s.Garbage))
	fmt.Fprintf(&b, "  refusals           %s\n", formatCounts(s.Refusals))
	fmt.Fprintf(&b, "  open listener      %d workers created (max_workers %d)\n", s.OpenListenerWorkers, OpenMaxWorkers)
	fmt.Fprintf(&b, "  RSS                first %.1f MiB, last %.1f MiB, max %.1f MiB; last process: first-third max %.1f MiB, last-third max %.1f MiB, limit %.1f MiB (%s) -> %s\n",
		s.RSS.First/(1<<20), s.RSS.Last/(1<<20), s.RSS.Max/(1<<20), s.RSS.Verdict.FirstMax/(1<<20), s.RSS.Verdict.LastMax/(1<<20), s.RSS.Verdict.Limit/(1<<20), s.RSS.Rule, flatWord(s.RSS.Verdict))
	fmt.Fprintf(&b, "  goroutines         first %.0f, last %.0f, max %.0f; last process: first-third max %.0f, last-third max %.0f, limit %.0f (%s) -> %s\n",
		s.Goroutines.First, s.Goroutines.Last, s.Goroutines.Max, s.Goroutines.Verdict.FirstMax, s.Goroutines.Verdict.LastMax, s.Goroutines.Verdict.Limit, s.Goroutines.Rule, flatWord(s.Goroutines.Verdict))
	fmt.Fprintf(&b, "  work dir           %s\n", s.Dir)
	if len(s.FailureCounts) > 0 {
		fmt.Fprintf(&b, "  FAILURES           %s\n", formatCounts(s.FailureCounts))
		for _, f := range s.Failures {
			fmt.Fprintf(&b, "    - %s\n", f)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func flatWord(v FlatVerdict) string {
	if v.Flat {
		return "flat"
	}
	return "NOT FLAT"
}

// formatCounts lists a map's counts as "k=v" sorted by key.
func formatCounts[V int | int64](m map[string]V) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// summary assembles the run's summary.
func (r *runner) summary(elapsed time.Duration, loadStart string) *Summary {
	s := &Summary{
		Seed: r.opts.Seed, Duration: elapsed.Seconds(), Dir: r.opts.Dir,
		LoadAvgStart: loadStart, LoadAvgEnd: loadAvg(),
		Garbage: r.garbage.Counts(), Refusals: map[string]int64{},
		Load: r.load.Stats(), MaxRefused: r.opts.MaxRefused,
	}
	s.Command = r.opts.Command
	if s.Command == "" {
		s.Command = fmt.Sprintf("kvsoak --duration %v --seed %d", r.opts.Duration, r.opts.Seed)
	}
	s.Engines.Count = len(r.engines)
	for _, e := range r.engines {
		st := e.Stats()
		s.Engines.Steps += st.Steps
		s.Engines.Lost += st.Lost
		s.Engines.Events += st.Events
		s.Engines.Stored += st.Stored
		s.Engines.Removed += st.Removed
		s.Engines.Clears += st.Clears
		s.Engines.Restarts += st.Restarts
		s.Engines.Requests += st.Requests
	}
	for _, v := range s.Garbage {
		s.GarbageTotal += v
	}
	r.mu.Lock()
	s.Daemon = DaemonSummary{Processes: r.process, Terminated: r.terminated, Killed: r.killed, ErrorLogLines: r.errorLines}
	for _, c := range r.cpu {
		s.Daemon.CPUSeconds += c
	}
	for _, ws := range r.lastWorkers {
		for _, w := range ws {
			if _, ok := r.byRef[refOf(w)]; !ok {
				continue
			}
			x := &s.Index
			x.Batches += w.GetBatches()
			x.Events += w.GetEvents()
			x.Replays += w.GetReplays()
			x.ReplayedBatches += w.GetReplayedBatches()
			x.ReplayContinuations += w.GetReplayContinuations()
			x.ReplayFailures += w.GetReplayFailures()
			x.StaleReplays += w.GetStaleReplays()
			x.Gaps += w.GetGaps()
			x.MissedBatches += w.GetMissedBatches()
			x.UnrecoveredGaps += w.GetUnrecoveredGaps()
			x.Duplicates += w.GetDuplicates()
			x.Restarts += w.GetRestarts()
			x.Resets += w.GetResets()
			x.Clears += w.GetClears()
			x.Orphans += w.GetOrphans()
			x.UnknownBlocks += w.GetUnknownBlocks()
			x.ApplyErrors += w.GetApplyErrors()
			if w.GetJoinedAtSeq() > 0 {
				x.LateJoins++
			}
		}
	}
	for _, ms := range r.lastMetrics {
		ms.Each("kvindex_push_refused_total", func(l map[string]string, v float64) {
			s.Refusals[strings.TrimPrefix(l["listener"], "tcp://")+" "+l["reason"]] += int64(v)
		})
	}
	s.OpenListenerWorkers = countOn(r.lastWorkers[r.process], r.fleet.OpenPushAddr())
	s.RSS = seriesOf(r.samples, r.process, func(x sample) float64 { return x.rss }, RSSRule(), "last third <= 1.25 x first third + 8 MiB")
	s.Goroutines = seriesOf(r.samples, r.process, func(x sample) float64 { return x.goroutines }, GoroutineRule(), "last third <= 1.25 x first third + 16")
	r.mu.Unlock()
	s.Checks = CheckSummary{Checkpoints: r.checkpoints.Load(), ScoresChecked: r.scoresChecked.Load(), Comparisons: r.comparisons.Load(), WrongAnswers: r.wrong.Load(), ResidentChecks: r.residentChecks.Load()}
	s.FailureCounts, s.Failures = r.fail.Counts(), r.fail.Kept()
	s.Passed = r.fail.Count() == 0
	return s
}

func seriesOf(samples []sample, process int, get func(sample) float64, rule FlatRule, text string) SeriesSummary {
	var out SeriesSummary
	var last []float64
	for i, s := range samples {
		v := get(s)
		if i == 0 {
			out.First = v
		}
		out.Last, out.Max = v, max(out.Max, v)
		out.Samples++
		if s.process == process && s.settled {
			last = append(last, v)
		}
	}
	out.Rule = text
	out.Verdict, _ = rule.Judge(last)
	return out
}

// loadAvg returns /proc/loadavg's three load averages.
func loadAvg() string {
	l := proc.LoadAvg()
	return fmt.Sprintf("%.2f %.2f %.2f", l[0], l[1], l[2])
}
