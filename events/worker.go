package events

import "strconv"

// WorkerRef names one KV cache: a pod and its data-parallel rank. A pod with
// dp_size N publishes N independent caches, one per rank, and each is indexed
// as its own worker.
type WorkerRef struct {
	// Pod is the operator's name for the engine pod (or its address).
	Pod string
	// DPRank is the data-parallel rank within the pod, 0 without DP.
	DPRank int
}

// String renders the worker as "pod/rank", the form kvindexctl prints and accepts.
func (w WorkerRef) String() string { return w.Pod + "/" + strconv.Itoa(w.DPRank) }

// Sink receives one worker's decoded batches, in seq order, from one
// goroutine at a time. The indexer implements it per worker.
type Sink interface {
	// ApplyBatch applies every event of b in order. It returns the problems
	// it met (already counted by the sink) so that the caller can log them;
	// a problem in one event never stops the others. b is only valid
	// during the call.
	ApplyBatch(b *Batch) error
	// Reset forgets everything the worker was known to hold, e.g. after an
	// engine restart; reason says why, for logs and counters.
	Reset(reason string)
}

// SeqSink is a Sink that wants each batch with the engine seq it carried,
// e.g. an agent that checkpoints its state with the seq to resume from.
// A transport that knows seqs calls ApplyBatchAt instead of ApplyBatch.
type SeqSink interface {
	Sink
	// ApplyBatchAt applies b, the engine's batch seq; as ApplyBatch.
	ApplyBatchAt(seq uint64, b *Batch) error
}
