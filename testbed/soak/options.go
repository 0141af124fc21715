package soak

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// Options configure a soak run (kvsoak's flags say what each is).
type Options struct {
	// Duration is how long the fleet runs under load (the warm-up, the
	// final checkpoint and shutdown come on top).
	Duration time.Duration
	Seed     uint64
	// Dir holds the configuration, the daemon binary and the daemon logs.
	Dir    string
	GoTool string
	// WarmupSteps let the daemon join engines whose replay buffers no
	// longer reach back to their start.
	WarmupSteps int
	// MaxRefused is the largest fraction of the load's Score and Route
	// calls the daemon's admission control may refuse for overload
	// (api.IsOverloaded): not a wrong answer, but more fail the run.
	MaxRefused float64
	Logger     *slog.Logger // nil discards progress
}

// The run's fixed rates and intervals. The daemon restarts fall within
// the first 60% of the run, so that the last process runs long enough to
// judge its memory.
const (
	checkpointEvery    = 5 * time.Second
	scoreRPS, routeRPS = 40, 10
	stepInterval       = 30 * time.Millisecond
	engineRestartEvery = 5 * time.Second
	engineDown         = 200 * time.Millisecond
	daemonRestarts     = 2
	garbageInterval    = 100 * time.Millisecond
	sampleEvery        = 500 * time.Millisecond
)

// DefaultOptions are the soak's defaults: two minutes, seed 1, and 5% of
// calls refused for overload at most (on a loaded shared host, a CPU
// stall of more than the daemon's 50 ms queueing budget refuses the calls
// waiting out the stall, a few in a hundred at most).
func DefaultOptions() Options {
	return Options{Duration: 2 * time.Minute, Seed: 1, GoTool: "go", WarmupSteps: 11_000, MaxRefused: 0.05}
}

// Validate reports the first option that cannot run, naming it.
func (o *Options) Validate() error {
	switch {
	case o.Duration <= 0:
		return fmt.Errorf("soak: options: duration %v must be positive", o.Duration)
	case !(o.MaxRefused >= 0 && o.MaxRefused <= 1):
		return fmt.Errorf("soak: options: max-refused %v must be in [0, 1]", o.MaxRefused)
	case o.WarmupSteps < 0:
		return fmt.Errorf("soak: options: warmup-steps %d must not be negative", o.WarmupSteps)
	}
	return nil
}

// commandLine returns the kvsoak command that reproduces a run with o:
// its duration, the options that differ from DefaultOptions, and its seed.
func (o *Options) commandLine() string {
	d := DefaultOptions()
	parts := []string{"kvsoak", "--duration", o.Duration.String()}
	if o.WarmupSteps != d.WarmupSteps {
		parts = append(parts, "--warmup-steps", strconv.Itoa(o.WarmupSteps))
	}
	if o.MaxRefused != d.MaxRefused {
		parts = append(parts, "--max-refused", strconv.FormatFloat(o.MaxRefused, 'g', -1, 64))
	}
	return strings.Join(append(parts, "--seed", strconv.FormatUint(o.Seed, 10)), " ")
}
