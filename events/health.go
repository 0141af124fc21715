package events

import "sync/atomic"

// Health is what kvindex currently knows about whether a worker's index
// entry can be trusted.
type Health uint32

const (
	// HealthUnknown: the worker has not been heard from yet.
	HealthUnknown Health = iota
	// HealthOK: the stream is connected and in sequence.
	HealthOK
	// HealthRecovering: a replay is filling a seq gap; the index may lack
	// the gap's events for up to the replay timeout.
	HealthRecovering
	// HealthUnsynced: events were lost and could not be replayed, and the
	// gap policy kept the worker's blocks; answers may name blocks it no
	// longer holds (or miss some it does) until its next clear or restart.
	HealthUnsynced
	// HealthStale: the endpoint stopped answering, or the worker sent
	// nothing for longer than the silence limit.
	HealthStale
	// HealthConflict: two publishers send on the worker's topic (their
	// seqs interleave); its events cannot be ordered, so none are applied
	// until one of them stops, and answers leave the worker out.
	HealthConflict
	// HealthDegraded: in sequence, but some of the worker's recent events
	// could not be decoded or applied (see WorkerStats.HealthReason);
	// answers may miss what those events said.
	HealthDegraded
	// NumHealth is the number of Health values.
	NumHealth = int(HealthDegraded) + 1
)

var healthNames = [NumHealth]string{"UNKNOWN", "OK", "RECOVERING", "UNSYNCED", "STALE", "CONFLICT", "DEGRADED"}

// Trusted reports whether answers may name a worker in this state: not
// stale (its endpoint is gone) and not in conflict (its events cannot be
// ordered).
func (h Health) Trusted() bool { return h != HealthStale && h != HealthConflict }

// String returns the upper-case name of the health state.
func (h Health) String() string {
	if int(h) < NumHealth {
		return healthNames[h]
	}
	return "Health(?)"
}

// HealthCell holds one worker's current Health. It is updated by the
// subscriber and read lock-free by Score (one atomic load).
type HealthCell struct{ v atomic.Uint32 }

// Load returns the current health.
func (c *HealthCell) Load() Health {
	if c == nil {
		return HealthUnknown
	}
	return Health(c.v.Load())
}

// Store sets the current health; a transport calls it from the one
// goroutine (or under the lock) that decides the worker's health.
func (c *HealthCell) Store(h Health) { c.v.Store(uint32(h)) }
