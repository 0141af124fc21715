package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/internal/defaults"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TopArgs are kvindexctl top's arguments.
type TopArgs struct {
	// Model lists only that model's workers.
	Model string
	// Interval is the refresh period (0: 2 s).
	Interval time.Duration
	// Iterations stops after this many tables (0: until interrupted).
	Iterations int
	// Clear clears the terminal before each table.
	Clear bool
}

// TopRow is one worker's line of kvindexctl top.
type TopRow struct {
	Worker       string  `json:"worker"`
	Model        string  `json:"model"`
	Health       string  `json:"health"`
	EventsPerSec float64 `json:"events_per_sec"`
	Resident     uint64  `json:"resident_blocks"`
	Gaps         uint64  `json:"gaps"`
	Replays      uint64  `json:"replays"`
	// StaleSecs is the age of the last event, in seconds (-1: never).
	StaleSecs float64 `json:"last_event_age_secs"`
	Inflight  uint32  `json:"inflight_requests"`
	// HitRatio is the predicted hit ratio of answers that ranked the
	// worker first, over the interval (-1 when none were answered); the
	// total since the server started is HitRatioTotal.
	HitRatio      float64 `json:"predicted_hit_ratio"`
	HitRatioTotal float64 `json:"predicted_hit_ratio_total"`
}

// TopRows computes top's rows from two ListWorkers answers taken dt apart
// (prev may be nil: rates are then 0).
func TopRows(prev, cur *kvindexv1.ListWorkersResponse, dt time.Duration, now time.Time) []TopRow {
	before := map[string]*kvindexv1.WorkerStatus{}
	for _, ws := range prev.GetWorkers() {
		before[WorkerName(ws.GetWorker())] = ws
	}
	var rows []TopRow
	for _, ws := range cur.GetWorkers() {
		name := WorkerName(ws.GetWorker())
		r := TopRow{
			Worker: name, Model: orDash(ws.GetModel()), Health: strings.ToLower(healthName(ws.GetHealth())),
			Resident: ws.GetResidentBlocks(), Gaps: ws.GetGaps(), Replays: ws.GetReplays(), Inflight: ws.GetInflightRequests(),
			StaleSecs: -1, HitRatio: -1, HitRatioTotal: -1,
		}
		if ws.GetLastEventTime() != nil {
			r.StaleSecs = now.Sub(ws.GetLastEventTime().AsTime()).Seconds()
		}
		if p := ws.GetScoredPromptTokens(); p > 0 {
			r.HitRatioTotal = float64(ws.GetPredictedHitTokens()) / float64(p)
		}
		if b := before[name]; b != nil && dt > 0 {
			if ws.GetEvents() >= b.GetEvents() {
				r.EventsPerSec = float64(ws.GetEvents()-b.GetEvents()) / dt.Seconds()
			}
			if dp := ws.GetScoredPromptTokens() - b.GetScoredPromptTokens(); ws.GetScoredPromptTokens() > b.GetScoredPromptTokens() {
				r.HitRatio = float64(ws.GetPredictedHitTokens()-b.GetPredictedHitTokens()) / float64(dp)
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// RenderTop prints top's table.
func RenderTop(w io.Writer, rows []TopRow) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "WORKER\tMODEL\tHEALTH\tEVENTS/S\tRESIDENT\tGAPS\tREPLAYS\tLAST EVENT\tINFLIGHT\tHIT%\tHIT% TOTAL")
	for _, r := range rows {
		last := "never"
		if r.StaleSecs >= 0 {
			last = Age(time.Duration(r.StaleSecs * float64(time.Second)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%d\t%d\t%d\t%s\t%d\t%s\t%s\n", r.Worker, r.Model, r.Health, r.EventsPerSec, r.Resident, r.Gaps, r.Replays, last, r.Inflight, pct(r.HitRatio), pct(r.HitRatioTotal))
	}
	return tw.Flush()
}

func pct(r float64) string {
	if r < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", 100*r)
}

// Top prints a per-worker table every interval: events/s, resident
// blocks, gaps, replays, staleness, in-flight requests and the predicted
// hit ratio of the answers that ranked the worker first. With Config.JSON
// each table is one JSON array a line.
func Top(ctx context.Context, cfg Config, args TopArgs) error {
	defaults.Positive(&args.Interval, 2*time.Second)
	call := cfg
	cfg.Timeout = 0 // each call gets its own below
	return withClient(ctx, cfg, func(ctx context.Context, c *api.Client) error {
		var prev *kvindexv1.ListWorkersResponse
		var prevAt time.Time
		for i := 0; args.Iterations == 0 || i < args.Iterations; i++ {
			if i > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(args.Interval):
				}
			}
			cctx, cancel := call.deadline(ctx)
			cur, err := c.ListWorkers(cctx, &kvindexv1.ListWorkersRequest{Model: args.Model})
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return callError("top", cfg.Addr, err)
			}
			now := cfg.now()
			rows := TopRows(prev, cur, now.Sub(prevAt), now)
			prev, prevAt = cur, now
			if cfg.JSON {
				if err := writeJSONValue(cfg.Out, rows, false); err != nil {
					return err
				}
				continue
			}
			if args.Clear {
				fmt.Fprint(cfg.Out, "\033[H\033[2J")
			}
			fmt.Fprintf(cfg.Out, "%s  %s  every %s\n", cfg.Addr, now.UTC().Format(time.RFC3339), args.Interval)
			if err := RenderTop(cfg.Out, rows); err != nil {
				return err
			}
		}
		return nil
	})
}
