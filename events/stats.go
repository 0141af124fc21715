package events

import "time"

// WorkerStats is a snapshot of what the subscriber saw from one worker's
// event stream: the transport-side half of a worker's health (the index
// keeps the other half).
type WorkerStats struct {
	// Worker is the worker the stream belongs to.
	Worker WorkerRef
	// Endpoint is the ZMQ endpoint the events come from (or the bound
	// endpoint, in push mode).
	Endpoint string
	// Topic is the ZMQ topic of the worker's messages.
	Topic string
	// ReplayEndpoint is the engine's replay socket, "" for none.
	ReplayEndpoint string
	// Health is the worker's current health.
	Health Health
	// HealthReason says why Health is not OK, "" when it is.
	HealthReason string
	// Connected reports whether the pull-mode socket has a connection to
	// the engine (always false in push mode, where it is not known).
	Connected bool
	// StaleSince is when the worker last became stale (zero if it is not).
	StaleSince time.Time
	// StaleTransitions counts times the worker became stale.
	StaleTransitions int64
	// Batches and Events count applied messages and the events in them:
	// each is counted once the worker's sink has applied it, so its
	// blocks are in the index by the time a snapshot shows it.
	Batches, Events int64
	// LastSeq is the seq of the last message applied (or, undecodable,
	// counted in DecodeErrors and skipped), set once the sink has applied
	// it as Batches is: a reader that sees an engine's seq here finds
	// that batch in the index and in answers. Valid when HasSeq.
	LastSeq uint64
	HasSeq  bool
	// LastMessage is when the last message arrived (zero if never).
	LastMessage time.Time
	// Gaps counts seq jumps forward (lost messages); MissedBatches is the
	// total number of seqs skipped by them.
	Gaps, MissedBatches int64
	// Replays counts replay requests; ReplayedBatches the batches they
	// applied; ReplayFailures the requests that failed or timed out.
	Replays, ReplayedBatches, ReplayFailures int64
	// UnrecoveredGaps counts gaps that replay could not fill, each handled
	// by the gap policy.
	UnrecoveredGaps int64
	// ReplayContinuations counts replay answers that arrived in part (the
	// engine dropped some at its send limit) and were asked for again
	// from the first missing seq.
	ReplayContinuations int64
	// StaleReplays counts replay answers that arrived after their replay
	// was given up (too slow) and were dropped unapplied.
	StaleReplays int64
	// JoinedAtSeq is the first seq known for the current engine process
	// when kvindex joined late and could not replay what came before it
	// (0 when nothing was missed).
	JoinedAtSeq uint64
	// Restarts counts seqs that went backwards (engine restarts), each of
	// which reset the worker.
	Restarts int64
	// Duplicates counts messages whose seq and payload repeat one already
	// applied; they are dropped.
	Duplicates int64
	// Conflicts counts times two publishers were found on the worker's
	// topic (interleaved seqs).
	Conflicts int64
	// ConflictReason describes the last conflict; UnsyncedReason the last
	// loss the gap policy kept.
	ConflictReason, UnsyncedReason string
	// DecodeErrors counts messages that could not be decoded and were skipped.
	DecodeErrors int64
	// ApplyErrors counts batches in which the index could not apply some event.
	ApplyErrors int64
	// Dropped counts messages dropped because the worker's queue was full.
	Dropped int64
	// Backlog is the number of batches waiting in the worker's queue.
	Backlog int
	// LastError is the most recent decode or apply problem, "" if none.
	LastError string
}

// StatsSource lists per-worker stream statistics; the subscriber implements it.
type StatsSource interface {
	// WorkerStats returns one entry per known worker.
	WorkerStats() []WorkerStats
}

// HealthSource gives lock-free access to each worker's health; the
// subscriber implements it.
type HealthSource interface {
	// Health returns the worker's cell, or nil for an unknown worker.
	Health(WorkerRef) *HealthCell
}

// Refusal is how many messages (or connections) one source of a transport
// refused for one reason, e.g. a push listener refusing a topic that names
// a pull-mode worker.
type Refusal struct {
	// Source names where the refused input arrived (a listener's address).
	Source string
	// Reason is a short snake_case cause, stable for metrics.
	Reason string
	// Count is the number refused so far.
	Count int64
}

// RefusalSource lists a transport's refusals; the ZeroMQ subscriber
// implements it.
type RefusalSource interface {
	// Refusals returns the non-zero counts.
	Refusals() []Refusal
}
