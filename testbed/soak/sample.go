package soak

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/proc"
)

// sample is one reading of the daemon's RSS and goroutines; settled
// says a checkpoint of its process had passed.
type sample struct {
	process         int
	settled         bool
	rss, goroutines float64
}

// runSampler samples the daemon's VmRSS, CPU, /metrics and ListWorkers
// (checked on the spot) every sampleEvery.
func (r *runner) runSampler(ctx context.Context) {
	every(ctx, sampleEvery, func(int) {
		mark := r.window.Mark()
		if r.window.Overlaps(mark) {
			return
		}
		c, n := r.currentChild()
		mem, rerr := proc.Mem(c.Pid())
		cpu, cerr := proc.CPU(c.Pid())
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		ms, merr := Scrape(sctx, r.http, r.fleet.MetricsAddr())
		lw, lerr := r.client.ListWorkers(sctx, &kvindexv1.ListWorkersRequest{})
		if r.window.Overlaps(mark) || ctx.Err() != nil {
			return
		}
		if err := errors.Join(rerr, cerr, merr, lerr); err != nil {
			r.fail.Add("sample_error", "daemon process %d: %v", n, err)
			return
		}
		g, ok := Metric(ms, "go_goroutines", nil)
		if !ok {
			r.fail.Add("sample_error", "daemon process %d: /metrics has no go_goroutines", n)
			return
		}
		r.record(n, lw.GetWorkers(), ms)
		r.mu.Lock()
		r.samples = append(r.samples, sample{process: n, settled: r.settled[n], rss: float64(mem.RSS), goroutines: g})
		r.cpu[n] = cpu.Seconds()
		r.mu.Unlock()
		r.checkWorkerList(lw.GetWorkers(), "sample")
	})
}

func (r *runner) record(process int, ws []*kvindexv1.WorkerStatus, ms Metrics) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ws != nil {
		r.lastWorkers[process] = ws
		if r.listed[process] == nil {
			r.listed[process] = map[listing]bool{}
		}
		for _, w := range ws {
			if w.GetWorker().GetDpRank() == 0 {
				r.listed[process][listing{w.GetWorker().GetPod(), w.GetEndpoint()}] = true
			}
		}
	}
	if ms != nil {
		r.lastMetrics[process] = ms
	}
}

// snapshot records the current process's ListWorkers and /metrics, best
// effort (before a restart, and at the end).
func (r *runner) snapshot(ctx context.Context) {
	_, n := r.currentChild()
	ms, _ := Scrape(ctx, r.http, r.fleet.MetricsAddr())
	lw, _ := r.client.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{})
	r.record(n, lw.GetWorkers(), ms)
}

// finalChecks are the end-of-run checks: each probe reached its refusal,
// the open listener filled up to max_workers, and the last daemon
// process's memory and goroutines are flat.
func (r *runner) finalChecks() {
	_, n := r.currentChild()
	r.mu.Lock()
	ms := r.lastMetrics[n]
	ws := r.lastWorkers[n]
	r.mu.Unlock()
	open, allow := r.fleet.OpenPushAddr(), r.fleet.AllowPushAddr()
	for _, want := range []struct{ listener, reason string }{
		{open, "unknown_topic"}, {open, "pull_worker"}, {open, "other_listener"}, {open, "other_model"},
		{open, "max_workers"}, {open, "dp_rank"}, {open, "undecodable"}, {allow, "address"},
	} {
		if v, _ := Metric(ms, "kvindex_push_refused_total", map[string]string{"listener": want.listener, "reason": want.reason}); v == 0 {
			r.fail.Add("probe_unrefused", "daemon process %d refused nothing for reason %s on %s: the probe did not reach it", n, want.reason, want.listener)
		}
	}
	r.checkRefused(r.load.snapshot())
	if got := countOn(ws, open); got != OpenMaxWorkers {
		r.fail.Add("max_workers", "the open listener created %d workers by the end, want its max_workers %d (garbage sent more pod names)", got, OpenMaxWorkers)
	}
	for _, x := range flatSeries {
		s, err := r.series(x.get, x.rule)
		switch v := s.Verdict; {
		case err != nil:
			r.fail.Add("not_flat", "daemon process %d %s: %v", n, x.what, err)
		case !v.Flat:
			r.fail.Add("not_flat", "daemon process %d %s grew: last-third max %.0f > %.0f (first-third max %.0f x %.2f + %.0f)", n, x.what, v.LastMax, v.Limit, v.FirstMax, x.rule.Ratio, x.rule.Slack)
		}
	}
}

// checkRefused fails the run when admission control refused more of the
// load's calls for overload than Options.MaxRefused allows.
func (r *runner) checkRefused(load map[string]int64) {
	if refused, calls := load["refused"], load["calls"]; float64(refused) > r.opts.MaxRefused*float64(calls) {
		r.fail.Add("overload_refused", "the daemon's admission control refused %d of %d Score and Route calls for overload (%.1f%%), more than max-refused %.1f%%", refused, calls, 100*float64(refused)/float64(max(calls, 1)), 100*r.opts.MaxRefused)
	}
}

func countOn(ws []*kvindexv1.WorkerStatus, endpoint string) int {
	n := 0
	for _, w := range ws {
		if w.GetEndpoint() == endpoint {
			n++
		}
	}
	return n
}

// flatSeries are the sampled series that must stay flat, with their rules.
var flatSeries = []struct {
	what string
	get  func(sample) float64
	rule FlatRule
}{
	{"RSS", func(x sample) float64 { return x.rss }, FlatRule{Ratio: 1.25, Slack: 8 << 20, MinSamples: 6, Text: "last third <= 1.25 x first third + 8 MiB"}},
	{"goroutines", func(x sample) float64 { return x.goroutines }, FlatRule{Ratio: 1.25, Slack: 16, MinSamples: 6, Text: "last third <= 1.25 x first third + 16"}},
}

// series summarises the samples got by get, and judges by rule those of
// the current daemon process after its first passed checkpoint.
func (r *runner) series(get func(sample) float64, rule FlatRule) (SeriesSummary, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := SeriesSummary{Rule: rule.Text}
	var last []float64
	for i, s := range r.samples {
		v := get(s)
		if i == 0 {
			out.First = v
		}
		out.Last, out.Max = v, max(out.Max, v)
		out.Samples++
		if s.process == r.process && s.settled {
			last = append(last, v)
		}
	}
	var err error
	out.Verdict, err = rule.Judge(last)
	return out, err
}

// FlatRule says when a series of samples of a long-running process is
// flat: split into thirds by count, the largest sample of the last third
// may exceed the largest of the first third by at most Ratio times it
// plus Slack. Comparing maxima leaves room for a start-up peak (the first
// third holds the join replay) and for a garbage collector's sawtooth,
// while a steady leak shows as a last third above the first. Fewer than
// MinSamples samples is an error; Text states the rule.
type FlatRule struct {
	Ratio, Slack float64
	MinSamples   int
	Text         string
}

// FlatVerdict is the outcome of FlatRule.Judge: the largest samples of
// the first and last thirds, Limit (FirstMax*Ratio+Slack), the number of
// samples judged, and whether LastMax <= Limit.
type FlatVerdict struct {
	FirstMax, LastMax, Limit float64
	Samples                  int
	Flat                     bool
}

// Judge applies the rule to samples in time order.
func (r FlatRule) Judge(samples []float64) (FlatVerdict, error) {
	n := len(samples)
	if n < max(r.MinSamples, 3) {
		return FlatVerdict{Samples: n}, fmt.Errorf("soak: %d samples, the flatness rule needs at least %d", n, max(r.MinSamples, 3))
	}
	third := n / 3
	v := FlatVerdict{Samples: n, FirstMax: slices.Max(samples[:third]), LastMax: slices.Max(samples[n-third:])}
	v.Limit = v.FirstMax*r.Ratio + r.Slack
	v.Flat = v.LastMax <= v.Limit
	return v, nil
}
