package soak

import (
	"fmt"
	"log/slog"
	"time"
)

// Options configure a soak run. DefaultOptions are `make soak`'s.
type Options struct {
	// Duration is how long the fleet runs under load (the warm-up, the
	// final checkpoint and shutdown come on top).
	Duration time.Duration
	// Seed derives every random choice.
	Seed uint64
	// Dir holds the configuration, the daemon binary and the daemon logs.
	Dir string
	// Binary is a prebuilt kvindex; "" builds ./cmd/kvindex with GoTool.
	Binary string
	GoTool string
	// CheckpointEvery is the time between exact checkpoints.
	CheckpointEvery time.Duration
	// ScoreRPS and RouteRPS are the gRPC load's rates.
	ScoreRPS, RouteRPS float64
	// StepInterval is each engine's time between steps.
	StepInterval time.Duration
	// EngineRestartEvery is the time between engine restarts (round
	// robin over the engines); EngineDown how long one stays down.
	EngineRestartEvery time.Duration
	EngineDown         time.Duration
	// DaemonRestarts is how many times the daemon is restarted, SIGTERM
	// and SIGKILL alternately, the last one SIGKILL; all within the first
	// 60% of Duration, so that the last process runs long enough to judge
	// its memory.
	DaemonRestarts int
	// GarbageInterval is the time between hostile probes.
	GarbageInterval time.Duration
	// WarmupSteps is how many steps each engine runs before the daemon
	// first starts, so that it joins engines whose replay buffers no
	// longer reach back to their start.
	WarmupSteps int
	// SampleEvery is the time between RSS and goroutine samples.
	SampleEvery time.Duration
	// MaxRefused is the largest fraction of the load's Score and Route
	// calls the daemon's admission control may refuse for overload
	// (ResourceExhausted, api.IsOverloaded): such a refusal is not a wrong
	// answer, but more of them fail the run (overload_refused).
	MaxRefused float64
	// Engine tunes the simulated engines.
	Engine EngineOptions
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
	// Command is the command line that reproduces the run, for the
	// summary ("" gives one from Duration and Seed).
	Command string
}

// DefaultMaxRefused is Options.MaxRefused's default: on a loaded shared
// host, a CPU stall of more than the daemon's 50 ms queueing budget
// refuses the calls waiting out the stall, a few in a hundred at most.
const DefaultMaxRefused = 0.05

// DefaultOptions are the soak's defaults: two minutes of six engines at
// about 30 steps a second each, 40 Scores and 10 Routes a second, an
// engine restart every 5 s, two daemon restarts, a hostile probe every
// 100 ms and a checkpoint every 5 s.
func DefaultOptions() Options {
	return Options{
		Duration:           2 * time.Minute,
		Seed:               1,
		GoTool:             "go",
		CheckpointEvery:    5 * time.Second,
		ScoreRPS:           40,
		RouteRPS:           10,
		StepInterval:       30 * time.Millisecond,
		EngineRestartEvery: 5 * time.Second,
		EngineDown:         200 * time.Millisecond,
		DaemonRestarts:     2,
		GarbageInterval:    100 * time.Millisecond,
		WarmupSteps:        11_000,
		SampleEvery:        500 * time.Millisecond,
		MaxRefused:         DefaultMaxRefused,
		Engine:             DefaultEngineOptions(),
	}
}

// Validate reports the first option that cannot run, naming it.
func (o *Options) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"duration", o.Duration}, {"checkpoint-every", o.CheckpointEvery}, {"step-interval", o.StepInterval}, {"sample-every", o.SampleEvery}, {"garbage-interval", o.GarbageInterval}} {
		if d.v <= 0 {
			return fmt.Errorf("soak: options: %s %v must be positive", d.name, d.v)
		}
	}
	switch {
	case o.ScoreRPS <= 0 || o.RouteRPS <= 0:
		return fmt.Errorf("soak: options: score-rps %v and route-rps %v must be positive", o.ScoreRPS, o.RouteRPS)
	case !(o.MaxRefused >= 0 && o.MaxRefused <= 1):
		return fmt.Errorf("soak: options: max-refused %v must be in [0, 1]", o.MaxRefused)
	case o.EngineRestartEvery < 0 || o.DaemonRestarts < 0 || o.WarmupSteps < 0:
		return fmt.Errorf("soak: options: engine-restart-every %v, daemon-restarts %d and warmup-steps %d must not be negative", o.EngineRestartEvery, o.DaemonRestarts, o.WarmupSteps)
	case o.Engine.ClearEvery <= 0 || o.Engine.ClearEvery >= o.Engine.BufferSteps:
		return fmt.Errorf("soak: options: engines' clear_every %d must be in (0, buffer steps %d)", o.Engine.ClearEvery, o.Engine.BufferSteps)
	}
	return nil
}
