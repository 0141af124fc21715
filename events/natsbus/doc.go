// Package natsbus is kvindex's fleet transport over NATS: an agent (a
// sidecar beside one vLLM pod) publishes each of its workers' deltas on
// core NATS subjects, serves snapshots over request/reply, and registers
// the workers in a JetStream key-value bucket kept alive by heartbeat; a
// replica (kvindex serve with a nats source) watches the bucket, and for
// each worker loads a snapshot, applies the deltas after it in seq order,
// and resyncs from a fresh snapshot on a gap, a new epoch, a delta that
// does not fit, a full queue or a NATS reconnection.
//
// Blocks are named by content keys (the keyed model in package events);
// the wire messages are kvindex.fleet.v1 protobufs (proto/kvindex/fleet/v1),
// and docs/fleet.md states the subjects and the protocol. The package
// moves deltas and snapshots; the index (which implements LocalWorker on
// an agent and KeyedSink on a replica) computes and applies them.
//
// # Concurrency
//
// An Agent serialises each worker's publish with its snapshots on the
// worker's mutex; a Source runs one goroutine per worker, which alone
// applies that worker's snapshots and deltas. Both are safe for
// concurrent use.
package natsbus
