// Package natsbus is kvindex's fleet transport over NATS: an agent (a
// sidecar beside one vLLM pod) publishes its workers' deltas on core NATS,
// serves snapshots by request/reply, and registers the workers in a
// JetStream key-value bucket kept alive by heartbeat; a replica watches the
// bucket and, per worker, loads a snapshot, applies the deltas after it in
// seq order, and resyncs on a gap, a new epoch, a delta that does not fit, a
// full queue or a NATS reconnection.
//
// Blocks are named by content keys (package events' keyed model); messages
// are kvindex.fleet.v1 protobufs, and docs/fleet.md states the subjects and
// protocol. The index computes and applies what this package moves
// (LocalWorker on an agent, KeyedSink on a replica). Agent and Source are
// safe for concurrent use.
package natsbus
