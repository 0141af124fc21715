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
	// Batches and Events count decoded messages and the events in them.
	Batches, Events int64
	// LastSeq is the last seq seen; valid when HasSeq.
	LastSeq uint64
	HasSeq  bool
	// LastMessage is when the last message arrived (zero if never).
	LastMessage time.Time
	// Gaps counts seq jumps forward (lost messages); MissedBatches is the
	// total number of seqs skipped by them.
	Gaps, MissedBatches int64
	// Restarts counts seqs that went backwards (engine restarts), each of
	// which reset the worker.
	Restarts int64
	// DecodeErrors counts messages that could not be decoded and were skipped.
	DecodeErrors int64
	// ApplyErrors counts batches in which the index could not apply some event.
	ApplyErrors int64
	// LastError is the most recent decode or apply problem, "" if none.
	LastError string
}

// StatsSource lists per-worker stream statistics; the subscriber implements it.
type StatsSource interface {
	// WorkerStats returns one entry per known worker.
	WorkerStats() []WorkerStats
}
