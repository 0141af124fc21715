package soak

import (
	"context"
	"errors"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/proc"
)

// runSampler samples the daemon every SampleEvery: VmRSS, go_goroutines,
// /metrics and ListWorkers (checked on the spot).
func (r *runner) runSampler(ctx context.Context) {
	every(ctx, sampleEvery, func(int) bool {
		r.sampleOnce(ctx)
		return true
	})
}

func (r *runner) sampleOnce(ctx context.Context) {
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
	r.samples = append(r.samples, sample{at: time.Now(), process: n, settled: r.settled[n], rss: float64(mem.RSS), goroutines: g})
	r.cpu[n] = cpu.Seconds()
	r.mu.Unlock()
	r.checkWorkerList(lw.GetWorkers(), "sample")
}

// record keeps a process's latest ListWorkers and /metrics.
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
// the open listener filled up to max_workers and no further, and the
// last daemon process's memory and goroutines are flat.
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
	r.checkRefused(r.Stats())
	if got := countOn(ws, open); got != OpenMaxWorkers {
		r.fail.Add("max_workers", "the open listener created %d workers by the end, want its max_workers %d (garbage sent more pod names)", got, OpenMaxWorkers)
	}
	var rss, gor []float64
	r.mu.Lock()
	for _, s := range r.samples {
		if s.process == n && s.settled {
			rss, gor = append(rss, s.rss), append(gor, s.goroutines)
		}
	}
	r.mu.Unlock()
	for _, x := range []struct {
		what   string
		series []float64
		rule   FlatRule
	}{{"RSS", rss, RSSRule()}, {"goroutines", gor, GoroutineRule()}} {
		v, err := x.rule.Judge(x.series)
		switch {
		case err != nil:
			r.fail.Add("not_flat", "daemon process %d %s: %v", n, x.what, err)
		case !v.Flat:
			r.fail.Add("not_flat", "daemon process %d %s grew: last-third max %.0f > %.0f (first-third max %.0f x %.2f + %.0f)", n, x.what, v.LastMax, v.Limit, v.FirstMax, x.rule.Ratio, x.rule.Slack)
		}
	}
}

// checkRefused fails the run when admission control refused more of the
// load's calls for overload than Options.MaxRefused allows.
func (r *runner) checkRefused(ls LoadStats) {
	if float64(ls.Refused) > r.opts.MaxRefused*float64(ls.Calls) {
		r.fail.Add("overload_refused", "the daemon's admission control refused %d of %d Score and Route calls for overload (%.1f%%), more than max-refused %.1f%%", ls.Refused, ls.Calls, 100*float64(ls.Refused)/float64(max(ls.Calls, 1)), 100*r.opts.MaxRefused)
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
