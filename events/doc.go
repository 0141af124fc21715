// Package events gets KV-cache events into kvindex: it decodes vLLM's (and
// SGLang's) msgpack payloads into a small event model (Batch, Event), and
// subscribes to engines over ZeroMQ, tracking each worker's sequence
// numbers so that lost messages and engine restarts are seen, never
// silently absorbed. It also holds the sending half of the wire format
// (Publisher, AppendPayload), used by simulated engines and tests.
//
// # Wire format
//
// A message is three frames: topic, an 8-byte big-endian seq, and a msgpack
// payload [ts, [event...], dp_rank]. Events are tagged positional arrays
// (vLLM before mid-2026) or tagged maps (since); both are accepted, as are
// every field count since vLLM 0.9, the map envelope, and block hashes sent
// as uint64, int64 or 32-byte digests (folded to their last 8 bytes read
// big-endian, as vLLM's own int form is). Decoding never panics: malformed
// input returns an error wrapping ErrMalformed that says what was wrong and
// at which byte offset.
//
// # Identity
//
// A worker is a (pod, data-parallel rank) pair, WorkerRef: each DP rank has
// its own KV cache and publishes on its own port.
//
// # Concurrency
//
// A Decoder is not safe for concurrent use; use one per goroutine. The
// Subscriber runs one goroutine per endpoint, which owns its socket and
// decoder and hands batches to that worker's Sink in seq order; its stats
// may be read from any goroutine. A Publisher serialises its sends.
//
// The package imports nothing from the rest of kvindex: data flows from
// here to the indexer through the Sink interface.
package events
