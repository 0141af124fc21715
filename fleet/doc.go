// Package fleet assembles fleet mode from its parts: an Agent (kvindex
// agent) indexes one pod's workers from the engine's ZeroMQ events with
// the index's recording apply and publishes the effects over NATS
// (events/natsbus); Replicas give a replica's NATS source keyed workers of
// its own index to feed. docs/fleet.md describes the topology and the
// protocol.
//
// The index records and applies indexer.Delta; the transport carries the
// event model's events.Delta; this package converts between them.
package fleet
