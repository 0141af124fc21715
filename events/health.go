package events

import "sync/atomic"

// Health says whether a worker's index entry can be trusted.
type Health uint32

const (
	// HealthUnknown: the worker has not been heard from yet.
	HealthUnknown Health = iota
	// HealthOK: the stream is connected and in sequence.
	HealthOK
	// HealthRecovering: a replay is filling a seq gap (up to its timeout).
	HealthRecovering
	// HealthUnsynced: lost events could not be replayed and the gap policy
	// kept the blocks; answers may be wrong until the next clear or restart.
	HealthUnsynced
	// HealthStale: the endpoint stopped answering, or the worker was silent
	// past the silence limit.
	HealthStale
	// HealthConflict: two publishers interleave on the topic; nothing is
	// applied until one stops, and answers leave the worker out.
	HealthConflict
	// HealthDegraded: in sequence, but recent events could not be decoded or
	// applied; answers may miss what they said.
	HealthDegraded
	// NumHealth is the number of Health values.
	NumHealth = int(HealthDegraded) + 1
)

var healthNames = [NumHealth]string{"UNKNOWN", "OK", "RECOVERING", "UNSYNCED", "STALE", "CONFLICT", "DEGRADED"}

// Trusted reports whether answers may name a worker in this state (not
// stale, not in conflict).
func (h Health) Trusted() bool { return h != HealthStale && h != HealthConflict }

// String returns the upper-case name of the health state.
func (h Health) String() string {
	if int(h) < NumHealth {
		return healthNames[h]
	}
	return "Health(?)"
}

// HealthCell holds one worker's Health, read lock-free by Score.
type HealthCell struct{ v atomic.Uint32 }

// Load returns the current health.
func (c *HealthCell) Load() Health {
	if c == nil {
		return HealthUnknown
	}
	return Health(c.v.Load())
}

// Store sets the current health.
func (c *HealthCell) Store(h Health) { c.v.Store(uint32(h)) }
