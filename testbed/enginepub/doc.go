// Package enginepub is the sending half of vLLM's KV-event wire over
// ZeroMQ: a PUB socket that sends [topic, seq, payload] exactly as vLLM's
// ZmqEventPublisher does, and a ROUTER that serves replay requests from a
// bounded buffer of recent batches the way vLLM's replay_endpoint does.
// Simulated engines (kvsim), the demo and the end-to-end tests publish
// through it; the daemon never imports it.
//
// # Concurrency
//
// A Publisher's methods may be called from several goroutines; sends are
// serialised. Its replay server runs on its own goroutine until Close.
package enginepub
