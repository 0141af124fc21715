package events

import "fmt"

// GapPolicy says what happens to a worker's blocks when lost events could
// not be replayed: lost removals leave blocks the engine no longer holds,
// lost stores hide blocks it holds, and neither can be told apart after.
type GapPolicy uint8

const (
	// GapReset (the default) forgets the worker's blocks and relearns: answers
	// can only under-state its cache. Counted as a reset.
	GapReset GapPolicy = iota
	// GapKeep keeps the blocks but marks the worker HealthUnsynced until its
	// next clear or restart.
	GapKeep
)

// String returns the policy's configuration name.
func (p GapPolicy) String() string {
	if p == GapKeep {
		return "keep"
	}
	return "reset"
}

// ParseGapPolicy reads "reset" or "keep".
func ParseGapPolicy(s string) (GapPolicy, error) {
	switch s {
	case "", "reset":
		return GapReset, nil
	case "keep":
		return GapKeep, nil
	}
	return GapReset, fmt.Errorf("events: gap policy %q: want reset or keep", s)
}
