package events

import "time"

// WorkerStats is what a transport saw of one worker's event stream: the
// transport's half of the worker's health (the index keeps the other).
type WorkerStats struct {
	Worker WorkerRef
	// Endpoint is the ZMQ endpoint the events come from (push mode: the
	// bound one, of the worker's DP rank); Topic is their topic.
	Endpoint, Topic string
	// ReplayEndpoint is the engine's replay socket, "" for none.
	ReplayEndpoint string
	Health         Health
	// HealthReason says why Health is not OK, "" when it is.
	HealthReason string
	// Connected: the pull-mode socket has a connection (false in push mode,
	// where it is not known).
	Connected bool
	// StaleSince is when the worker last became stale (zero if it is not).
	StaleSince       time.Time
	StaleTransitions int64
	// Batches and Events count messages and their events once the sink has
	// applied them, so a snapshot's blocks are in the index.
	Batches, Events int64
	// LastSeq is the seq of the last message applied (or skipped as
	// undecodable), set as Batches is: a reader that sees it finds that
	// batch in answers. Valid when HasSeq.
	LastSeq uint64
	HasSeq  bool
	// LastMessage is when the last message arrived (zero if never).
	LastMessage time.Time
	// Gaps counts seq jumps forward; MissedBatches the seqs they skipped.
	Gaps, MissedBatches int64
	// Replays counts replay requests, ReplayedBatches the batches they
	// applied, ReplayFailures those that failed or timed out.
	Replays, ReplayedBatches, ReplayFailures int64
	// UnrecoveredGaps counts gaps replay could not fill (each handled by
	// the gap policy).
	UnrecoveredGaps int64
	// ReplayContinuations counts replay answers cut short at the engine's
	// send limit and asked again from the first missing seq.
	ReplayContinuations int64
	// StaleReplays counts replay answers that came after their replay was
	// given up, dropped unapplied.
	StaleReplays int64
	// JoinedAtSeq is the first seq of the current engine process when
	// kvindex joined late and could not replay before it (0: none missed).
	JoinedAtSeq uint64
	// Restarts counts seqs that went backwards (engine restarts, each a reset).
	Restarts int64
	// Duplicates counts dropped messages repeating an applied seq and payload.
	Duplicates int64
	// Conflicts counts times two publishers were found on the topic.
	Conflicts int64
	// ConflictReason describes the last conflict; UnsyncedReason the last
	// loss the gap policy kept.
	ConflictReason, UnsyncedReason string
	// DecodeErrors counts skipped undecodable messages; ApplyErrors batches
	// with an event the index could not apply; Dropped messages dropped for
	// a full queue.
	DecodeErrors, ApplyErrors, Dropped int64
	// UnknownEvents counts events of a type kvindex does not know, skipped
	// with the rest of their batches applied; UnknownTag is the last one's
	// type (cut to 40 bytes).
	UnknownEvents int64
	UnknownTag    string
	// UnknownMediumEvents counts stores and removals naming a medium no
	// table knows (held in the Tiers' unknown class); UnknownMedia lists
	// such names, the first MaxUnknownMedia met. Neither degrades health.
	UnknownMediumEvents int64
	UnknownMedia        []string
	// Backlog is the batches waiting in the worker's queue.
	Backlog int
	// LastError is the most recent decode or apply problem, "" if none.
	LastError string
}

// MaxUnknownMedia bounds WorkerStats.UnknownMedia.
const MaxUnknownMedia = 8

// StatsSource lists per-worker stream statistics.
type StatsSource interface {
	// WorkerStats returns one entry per known worker.
	WorkerStats() []WorkerStats
}

// HealthSource gives lock-free access to each worker's health.
type HealthSource interface {
	// Health returns the worker's cell, or nil for an unknown worker.
	Health(WorkerRef) *HealthCell
}

// Refusal is how many messages (or connections) one source of a transport
// refused for one reason.
type Refusal struct {
	// Source names where the input arrived (a listener's address).
	Source string
	// Reason is a short snake_case cause, stable for metrics.
	Reason string
	Count  int64
}

// RefusalSource lists a transport's non-zero refusal counts.
type RefusalSource interface {
	Refusals() []Refusal
}
