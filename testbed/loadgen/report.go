package loadgen

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"runtime/debug"
	"strconv"
	"time"
)

// Report is a Run's outcome with what it ran against, in the form kvbench
// prints (Result says what the counts and latencies are). JSON field
// names are stable: scripts/bench.sh reads p99_ns. Checked says every
// reply was checked against the shape (a failed check is an error);
// WarmupSent is the unmeasured warm-up's requests (a server's CPU over
// the session is per WarmupSent + Sent calls).
type Report struct {
	Target      string  `json:"target"`
	Embedded    bool    `json:"embedded"`
	Shape       string  `json:"shape"`
	Request     string  `json:"request"`
	Rate        float64 `json:"rate"`
	Duration    string  `json:"duration"`
	Conns       int     `json:"concurrency"`
	Client      string  `json:"client"`
	Connections int     `json:"connections"`
	Checked     bool    `json:"checked"`

	WarmupSent int64   `json:"warmup_sent"`
	Scheduled  int64   `json:"scheduled"`
	Sent       int64   `json:"sent"`
	Errors     int64   `json:"errors"`
	Refused    int64   `json:"refused"`
	FirstError string  `json:"first_error,omitempty"`
	Achieved   float64 `json:"achieved_rps"`

	P50  int64 `json:"p50_ns"`
	P90  int64 `json:"p90_ns"`
	P99  int64 `json:"p99_ns"`
	P999 int64 `json:"p999_ns"`
	Max  int64 `json:"max_ns"`

	AcceptedP50  int64 `json:"accepted_p50_ns"`
	AcceptedP99  int64 `json:"accepted_p99_ns"`
	AcceptedP999 int64 `json:"accepted_p999_ns"`
	RefusedP50   int64 `json:"refused_p50_ns"`
	RefusedP99   int64 `json:"refused_p99_ns"`
	RefusedMax   int64 `json:"refused_max_ns"`

	LagP99 int64 `json:"lag_p99_ns"`
	LagMax int64 `json:"lag_max_ns"`

	Runtime Runtime `json:"runtime"` // the generator process's
}

// Runtime is a process's Go runtime settings, which a latency measured on
// a small shared machine depends on: GOGC -1 means off, MemoryLimit
// math.MaxInt64 none.
type Runtime struct {
	GOMAXPROCS  int   `json:"gomaxprocs"`
	GOGC        int   `json:"gogc"`
	MemoryLimit int64 `json:"memory_limit"`
}

// CurrentRuntime returns this process's settings.
func CurrentRuntime() Runtime {
	gogc := debug.SetGCPercent(-1)
	debug.SetGCPercent(gogc)
	return Runtime{GOMAXPROCS: runtime.GOMAXPROCS(0), GOGC: gogc, MemoryLimit: debug.SetMemoryLimit(-1)}
}

// String describes the settings in one line.
func (r Runtime) String() string {
	gogc, limit := strconv.Itoa(r.GOGC), "none"
	if r.GOGC < 0 {
		gogc = "off"
	}
	if r.MemoryLimit != math.MaxInt64 {
		limit = fmt.Sprintf("%d MiB", r.MemoryLimit>>20)
	}
	return fmt.Sprintf("GOMAXPROCS %d, GOGC %s, memory limit %s", r.GOMAXPROCS, gogc, limit)
}

// NewReport summarises r. blockKeys says what the requests carried.
func NewReport(target string, embedded bool, shape Shape, blockKeys bool, cfg Config, r *Result) Report {
	req := fmt.Sprintf("token_ids (%d per prompt)", shape.PromptBlocks*shape.BlockSize)
	if blockKeys {
		req = fmt.Sprintf("block_keys (%d per prompt)", shape.PromptBlocks)
	}
	q := func(h *Histogram, p float64) int64 { return int64(h.Quantile(p)) }
	return Report{
		Target: target, Embedded: embedded, Shape: shape.String(), Request: req,
		Rate: cfg.Rate, Duration: cfg.Duration.String(), Conns: cfg.Concurrency,
		Scheduled: r.Scheduled, Sent: r.Sent, Errors: r.Errors, Refused: r.Refused, FirstError: r.FirstError, Achieved: r.Achieved(),
		P50: q(&r.Latency, 0.5), P90: q(&r.Latency, 0.9), P99: q(&r.Latency, 0.99), P999: q(&r.Latency, 0.999), Max: int64(r.Latency.Max()),
		AcceptedP50: q(&r.Accepted, 0.5), AcceptedP99: q(&r.Accepted, 0.99), AcceptedP999: q(&r.Accepted, 0.999),
		RefusedP50: q(&r.Rejected, 0.5), RefusedP99: q(&r.Rejected, 0.99), RefusedMax: int64(r.Rejected.Max()),
		LagP99: q(&r.Lag, 0.99), LagMax: int64(r.Lag.Max()),
	}
}

// WriteText writes the report for people.
func (rep Report) WriteText(w io.Writer) error {
	kind := "remote kvindex"
	if rep.Embedded {
		kind = "embedded kvindex"
	}
	d := func(ns int64) string { return fmtDur(time.Duration(ns)) }
	checked := ", replies not checked"
	if rep.Checked {
		checked = ", every reply checked"
	}
	_, err := fmt.Fprintf(w, `target    %s (%s)
shape     %s
payload   %s
load      %.0f req/s open loop for %s, %d senders over %d %s connections
requests  %d scheduled, %d sent, %d errors, %d refused, %.1f req/s achieved%s
latency   p50 %s  p90 %s  p99 %s  p99.9 %s  max %s
accepted  p50 %s  p99 %s  p99.9 %s; refused p50 %s  p99 %s  max %s
generator lag p99 %s  max %s (already counted in latency)
runtime   %s
`,
		rep.Target, kind, rep.Shape, rep.Request, rep.Rate, rep.Duration, rep.Conns, rep.Connections, rep.Client,
		rep.Scheduled, rep.Sent, rep.Errors, rep.Refused, rep.Achieved, checked,
		d(rep.P50), d(rep.P90), d(rep.P99), d(rep.P999), d(rep.Max),
		d(rep.AcceptedP50), d(rep.AcceptedP99), d(rep.AcceptedP999), d(rep.RefusedP50), d(rep.RefusedP99), d(rep.RefusedMax),
		d(rep.LagP99), d(rep.LagMax), rep.Runtime)
	if err == nil && rep.FirstError != "" {
		_, err = fmt.Fprintf(w, "first error: %s\n", rep.FirstError)
	}
	if err != nil {
		return fmt.Errorf("loadgen: write report: %w", err)
	}
	return nil
}

// fmtDur prints a latency with 3 significant digits in µs or ms.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	}
	return d.Round(time.Millisecond).String()
}
