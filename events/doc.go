// Package events is kvindex's event model and the codec of the engines'
// wire format, with no transport: a step's KV events (Batch, Event), the
// storage tiers (Medium), worker identity (WorkerRef), canonical extra keys
// (ExtraKeys), the operator's medium table (Tiers), the interface a
// worker's events are applied through (Sink), and what a transport knows
// of a worker's stream (Health, WorkerStats). It
// decodes vLLM's (and SGLang's) msgpack payloads and encodes them
// (AppendPayload) for simulated engines and tests.
//
// It is pure Go; transports live below it (events/zmq, the only cgo, and
// events/natsbus), so a router that needs only the model, the index or the
// gRPC client builds with CGO_ENABLED=0.
//
// # Wire format
//
// A payload is msgpack [ts, [event...], dp_rank]. Events are tagged
// positional arrays (vLLM before mid-2026) or tagged maps (since); both are
// accepted, as are every field count since vLLM 0.9, the map envelope, and
// block hashes as uint64, int64 or 32-byte digests (folded to their last 8
// bytes big-endian, as vLLM's int form is). Decoding never panics: malformed
// input returns an error wrapping ErrMalformed naming the byte offset.
//
// An event whose tag is a str kvindex does not know (a newer engine's event
// type) is skipped and counted (Batch.UnknownEvents), and the rest of its
// batch decoded: only malformed msgpack loses a batch. The map era's
// "locality" (LOCAL or REMOTE; absent is local) is decoded, and a REMOTE
// block held as MediumExternal. Medium names, and the sources that send
// each, are tabled in Medium's doc; Tiers maps other names.
//
// # Identity
//
// A worker is a (pod, data-parallel rank) pair: each DP rank is one vLLM
// engine core with its own KV cache, publishing on its own port.
//
// # Concurrency
//
// A Decoder is not safe for concurrent use; a HealthCell is atomic. The
// package has no global mutable state and imports nothing from the rest of
// kvindex: data flows to the indexer through Sink.
package events
