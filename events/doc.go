// Package events is kvindex's event model and the codec of the engines'
// wire format, with no transport: the KV events of one engine step (Batch,
// Event), the storage tiers (Medium), worker identity (WorkerRef), the
// canonical extra keys (ExtraKeys), the interface a worker's events are
// applied through (Sink), and what a transport knows of a worker's stream
// (Health, WorkerStats). It decodes vLLM's (and SGLang's) msgpack payloads
// and encodes them (AppendPayload) for simulated engines and tests.
//
// It is pure Go. Transports live below it, one package each: events/zmq
// (vLLM's ZeroMQ PUB and replay sockets, the only cgo in kvindex). So a
// router that only needs the model, the index or the gRPC client builds
// with CGO_ENABLED=0.
//
// # Wire format
//
// A payload is msgpack [ts, [event...], dp_rank]. Events are tagged
// positional arrays (vLLM before mid-2026) or tagged maps (since); both are
// accepted, as are every field count since vLLM 0.9, the map envelope, and
// block hashes sent as uint64, int64 or 32-byte digests (folded to their
// last 8 bytes read big-endian, as vLLM's own int form is). Decoding never
// panics: malformed input returns an error wrapping ErrMalformed that says
// what was wrong and at which byte offset.
//
// # Identity
//
// A worker is a (pod, data-parallel rank) pair, WorkerRef: each DP rank is
// one vLLM engine core with its own KV cache, publishing on its own port
// (vLLM's metrics label it `engine`); a pod with dp_size N runs N engines,
// so N workers.
//
// # Concurrency
//
// A Decoder is not safe for concurrent use; use one per goroutine. A
// HealthCell is read and written with atomics. The package has no global
// mutable state and imports nothing from the rest of kvindex: data flows
// from here to the indexer through Sink.
package events
