package events

import "strconv"

// WorkerRef names one KV cache: a pod (name or address) and its
// data-parallel rank (0 without DP).
type WorkerRef struct {
	Pod    string
	DPRank int
}

// String renders "pod/rank", the form kvindexctl prints and accepts.
func (w WorkerRef) String() string { return w.Pod + "/" + strconv.Itoa(w.DPRank) }

// Sink receives one worker's batches in seq order, one goroutine at a time.
type Sink interface {
	// ApplyBatch applies b's events in order (b is valid only during the
	// call); it returns the problems met, already counted, for the caller to
	// log. A problem in one event never stops the others.
	ApplyBatch(b *Batch) error
	// Reset forgets everything the worker held; reason is for logs and counters.
	Reset(reason string)
}

// SeqSink is a Sink that wants each batch's engine seq (an agent that
// checkpoints the seq to resume from); transports that know seqs use it.
type SeqSink interface {
	Sink
	// ApplyBatchAt applies b, the engine's batch seq; as ApplyBatch.
	ApplyBatchAt(seq uint64, b *Batch) error
}
