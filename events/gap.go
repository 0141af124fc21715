package events

import "fmt"

// GapPolicy says what happens to a worker's blocks when events were lost
// and replay could not fill the gap. Lost BlockRemoved events leave blocks
// in the index that the engine no longer holds, and lost BlockStored events
// hide blocks it does hold; neither can be told apart afterwards.
type GapPolicy uint8

const (
	// GapReset (the default) forgets everything the worker was known to
	// hold and relearns from the next events: answers can only under-state
	// its cache, never route to blocks it evicted. Counted as a reset.
	GapReset GapPolicy = iota
	// GapKeep keeps the worker's blocks but marks it HealthUnsynced until
	// its next clear or restart, so every answer naming it says it may be
	// wrong.
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
