package sim

import (
	"bytes"
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// Describe is a one-line description of a run's setup for reports.
func Describe(w *workload.Workload, o Options) string {
	o, _ = o.withDefaults(w.Engines)
	st := w.Stats()
	s := fmt.Sprintf("%s: %d requests, %s prompt tokens, %s output tokens over %s; %d engines x %d blocks of %d tokens",
		w.Name, st.Requests, human(float64(st.PromptTokens)), human(float64(st.OutputTokens)), st.Duration.Round(time.Second),
		o.Engines, o.Engine.CacheBlocks, o.Engine.BlockSize)
	if len(o.Engine.Layout.Groups) > 0 {
		s += "; KV-cache groups " + o.Engine.Layout.String()
	}
	return s
}

// WriteTable prints one row per router, and when b is not nil each
// router's cached tokens as a fraction of the hit-rate bound and a last
// row with the bounds; agreeNote says where kvindex agreed with the
// engines beyond the daemon (fleet mode: every replica).
func WriteTable(w io.Writer, results []metrics.Result, b *Bounds, agreeNote string) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "router\thit tok\tof bound\thit req\tprefill tok\tTTFT p50\tp90\tp99\treq/s\tout tok/s\tskew\treq skew\tpreempt\trejected\twall\t")
	var notes []string
	for i := range results {
		r := &results[i]
		name := r.Router
		if r.Note != "" {
			notes = append(notes, fmt.Sprintf("[%d] %s: %s", len(notes)+1, r.Router, r.Note))
			name += fmt.Sprintf(" [%d]", len(notes))
		}
		if r.IndexProblems > 0 {
			notes = append(notes, fmt.Sprintf("[%d] %s: kvindex disagreed with the engines: %s", len(notes)+1, r.Router, cmp.Or(r.IndexDetail, fmt.Sprint(r.IndexProblems, " problems"))))
			name += fmt.Sprintf(" [%d]", len(notes))
		}
		ofBound := "-"
		if b != nil && b.CachedTokens > 0 {
			ofBound = pct(b.OfBound(r))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%.2f\t%.2f\t%d\t%d\t%s\t\n", name,
			pct(r.TokenHitRate()), ofBound, pct(r.RequestHitRate()), human(float64(r.PrefillTokens)),
			secs(r.TTFTP50), secs(r.TTFTP90), secs(r.TTFTP99), r.Throughput, human(r.OutputTokensPerSec),
			r.LoadSkew, r.RequestSkew, r.Preemptions, r.Rejected, r.Wall.Round(10*time.Millisecond))
	}
	if b != nil {
		fmt.Fprintf(tw, "%s\t%s\t%s\t-\t%s\t%s\t%s\t%s\t-\t-\t-\t-\t-\t-\t-\t\n", "bound",
			pct(b.TokenHitRate()), "100.0%", human(float64(b.PromptTokens-b.CachedTokens)),
			secs(b.TTFTP50), secs(b.TTFTP90), secs(b.TTFTP99))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	var agreed, charged []string
	for i := range results {
		r := &results[i]
		if r.IndexProblems == 0 {
			agreed = append(agreed, r.Router)
		}
		if r.RouteDelayP99 > 0 {
			charged = append(charged, fmt.Sprintf("%s mean %v, p99 %v", r.Router, r.RouteDelayMean.Round(time.Microsecond), r.RouteDelayP99.Round(time.Microsecond)))
		}
	}
	if len(charged) > 0 {
		fmt.Fprintf(w, "router latency charged to TTFT (wall clock, in virtual time): %s\n", strings.Join(charged, "; "))
	}
	if b != nil {
		fmt.Fprintln(w, "bound: hit tok with an infinite cache (each prompt's longest prefix some earlier request held); TTFT = own uncached prefill alone on an idle engine, no queueing")
	}
	if len(agreed) > 0 {
		fmt.Fprintf(w, "kvindex agreed with the engines (%s): every event applied, each KV-cache group's resident blocks equal its engine's cache%s\n", strings.Join(agreed, ", "), agreeNote)
	}
	writePrediction(w, results)
	return nil
}

// writePrediction prints, for the routers that asked kvindex, how its
// predicted hit on the chosen engine compared with the engine's hit, and,
// for those it gave an estimated TTFT, how the estimate compared with the
// TTFT.
func writePrediction(w io.Writer, results []metrics.Result) {
	var parts []string
	for i := range results {
		r := &results[i]
		if r.Predicted > 0 {
			parts = append(parts, fmt.Sprintf("%s error %s tokens (%s / %s), %s exact, %s over", r.Router,
				strconv.FormatFloat(r.PredictMAE(), 'f', 1, 64), strconv.FormatFloat(r.PredictRouteMAE(), 'f', 1, 64),
				strconv.FormatFloat(r.PredictQueueMAE(), 'f', 1, 64), pct(r.PredictExactShare()), pct(r.PredictOverShare())))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "kvindex's predicted hit vs the engine's, per request (mean absolute; in parentheses against the engine when routed / its cache changing while the request queued): %s\n", strings.Join(parts, "; "))
	}
	parts = parts[:0]
	for i := range results {
		r := &results[i]
		if r.Estimated == 0 {
			continue
		}
		s := fmt.Sprintf("%s %s against %s, error %s, %s within 25%%", r.Router, secs(r.EstMean()), secs(r.EstRealMean()), secs(r.EstMAE()), pct(r.EstWithinShare()))
		if r.EstLong > 0 {
			s += fmt.Sprintf("; the %d estimated at %s or more took %sx their estimate", r.EstLong, secs(metrics.EstLong), strconv.FormatFloat(r.EstLongRatio(), 'f', 2, 64))
		}
		parts = append(parts, s)
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "kvindex's estimated TTFT on the chosen engine vs the TTFT, per request (mean estimate against mean TTFT, mean absolute error): %s\n", strings.Join(parts, "; "))
	}
}

// WriteSweepTable prints token hit rate per cache size (rows) and router
// (columns), with the hit-rate bound when the points have it, then each
// router's cached tokens as a fraction of that bound.
func WriteSweepTable(w io.Writer, points []SweepPoint) error {
	if len(points) == 0 {
		return nil
	}
	withBound := points[0].Bounds != nil
	var bound func(p *SweepPoint) string
	if withBound {
		bound = func(p *SweepPoint) string { return pct(p.Bounds.TokenHitRate()) }
	}
	rejected := false
	err := writeSweepGrid(w, points, func(_ *SweepPoint, r *metrics.Result) string {
		rejected = rejected || r.Rejected > 0
		return sweepCell(r)
	}, bound)
	if err != nil {
		return err
	}
	if rejected {
		fmt.Fprintln(w, "(n rej): n requests could never fit an engine's cache and were rejected; the hit rate is over the rest; \"all rejected\": none ran")
	}
	if !withBound {
		return nil
	}
	fmt.Fprintln(w, "\nCached tokens as a fraction of the bound (an infinite cache):")
	return writeSweepGrid(w, points, func(p *SweepPoint, r *metrics.Result) string { return pct(p.Bounds.OfBound(r)) },
		func(*SweepPoint) string { return pct(1) })
}

// writeSweepGrid prints a row per cache size, a column of cell per
// router, and a "bound" column unless bound is nil.
func writeSweepGrid(w io.Writer, points []SweepPoint, cell func(*SweepPoint, *metrics.Result) string, bound func(*SweepPoint) string) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "blocks/engine\t")
	for _, r := range points[0].Results {
		fmt.Fprintf(tw, "%s\t", r.Router)
	}
	if bound != nil {
		fmt.Fprint(tw, "bound\t")
	}
	fmt.Fprintln(tw)
	for i := range points {
		p := &points[i]
		fmt.Fprintf(tw, "%d\t", p.CacheBlocks)
		for j := range p.Results {
			fmt.Fprintf(tw, "%s\t", cell(p, &p.Results[j]))
		}
		if bound != nil {
			fmt.Fprintf(tw, "%s\t", bound(p))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// sweepCell is the token hit rate and the requests rejected, if any (all
// rejected: no hit rate, not 0%).
func sweepCell(r *metrics.Result) string {
	switch {
	case r.Rejected == 0:
		return pct(r.TokenHitRate())
	case r.Scheduled == 0:
		return fmt.Sprintf("all rejected (%d)", r.Rejected)
	}
	return fmt.Sprintf("%s (%d rej)", pct(r.TokenHitRate()), r.Rejected)
}

// WriteCSV writes into dir results.csv (one row per router, then a
// "bound" row when b is not nil; the prediction columns last) and ttft_cdf.csv (each router's TTFT at
// every percentile 1..100, nearest rank).
func WriteCSV(dir string, results []metrics.Result, b *Bounds) error {
	rows := [][]string{{"router", "requests", "scheduled", "completed", "rejected", "prompt_tokens", "cached_tokens", "token_hit_rate", "hit_of_bound",
		"request_hit_rate", "prefill_tokens", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s", "makespan_s", "throughput_rps",
		"output_tokens_per_s", "load_skew", "request_skew", "preemptions", "index_problems", "index_detail", "wall_s", "note",
		"predicted", "predict_mae_tokens", "predict_exact", "predict_over", "predict_route_mae_tokens", "predict_queue_mae_tokens", "predict_lost",
		"estimated", "est_ttft_mean_s", "est_real_ttft_mean_s", "est_ttft_mae_s", "est_within_25pct", "est_long", "est_long_ratio"}}
	cdf := [][]string{{"router", "percentile", "ttft_s"}}
	for i := range results {
		r := &results[i]
		rows = append(rows, []string{r.Router, itoa(r.Requests), itoa(r.Scheduled), itoa(r.Completed), itoa(r.Rejected),
			i64(r.PromptTokens), i64(r.CachedTokens), fl(r.TokenHitRate()), fl(b.OfBound(r)), fl(r.RequestHitRate()), i64(r.PrefillTokens),
			fl(r.TTFTP50.Seconds()), fl(r.TTFTP90.Seconds()), fl(r.TTFTP99.Seconds()), fl(r.TTFTMean.Seconds()), fl(r.Makespan.Seconds()),
			fl(r.Throughput), fl(r.OutputTokensPerSec), fl(r.LoadSkew), fl(r.RequestSkew), itoa(r.Preemptions), i64(r.IndexProblems),
			r.IndexDetail, fl(r.Wall.Seconds()), r.Note, itoa(r.Predicted), fl(r.PredictMAE()), fl(r.PredictExactShare()), fl(r.PredictOverShare()),
			fl(r.PredictRouteMAE()), fl(r.PredictQueueMAE()), itoa(r.PredictLost),
			itoa(r.Estimated), fl(r.EstMean().Seconds()), fl(r.EstRealMean().Seconds()), fl(r.EstMAE().Seconds()), fl(r.EstWithinShare()),
			itoa(r.EstLong), fl(r.EstLongRatio())})
		for p := 1; p <= 100; p++ {
			cdf = append(cdf, []string{r.Router, itoa(p), fl(metrics.Percentile(r.TTFT, float64(p)).Seconds())})
		}
	}
	if b != nil {
		bound := []string{"bound", itoa(b.Requests), itoa(b.Requests), "", "", i64(b.PromptTokens), i64(b.CachedTokens),
			fl(b.TokenHitRate()), "1", "", i64(b.PromptTokens - b.CachedTokens), fl(b.TTFTP50.Seconds()), fl(b.TTFTP90.Seconds()),
			fl(b.TTFTP99.Seconds()), fl(b.TTFTMean.Seconds()), "", "", "", "", "", "", "", "", "", "offline: infinite cache, no queueing"}
		// The bound has no prediction or estimate: empty to the header's width.
		rows = append(rows, append(bound, make([]string, len(rows[0])-len(bound))...))
	}
	if err := writeCSV(filepath.Join(dir, "results.csv"), rows); err != nil {
		return err
	}
	return writeCSV(filepath.Join(dir, "ttft_cdf.csv"), cdf)
}

func writeCSV(path string, rows [][]string) error {
	var b bytes.Buffer
	if err := csv.NewWriter(&b).WriteAll(rows); err != nil {
		return fmt.Errorf("sim: %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	return nil
}

func pct(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }

func secs(d time.Duration) string {
	s := d.Seconds()
	switch {
	case s >= 100:
		return strconv.FormatFloat(s, 'f', 0, 64) + "s"
	case s >= 10:
		return strconv.FormatFloat(s, 'f', 1, 64) + "s"
	}
	return strconv.FormatFloat(s, 'f', 2, 64) + "s"
}

func human(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return strconv.FormatFloat(v/1e9, 'f', 2, 64) + "G"
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 1, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', 0, 64) + "k"
	case a >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func itoa(n int) string   { return strconv.Itoa(n) }
func i64(n int64) string  { return strconv.FormatInt(n, 10) }
func fl(f float64) string { return strconv.FormatFloat(f, 'g', 6, 64) }
