// Package soak is kvindex's soak test (testbed/cmd/kvsoak, `make soak`;
// docs/reliability.md lists what it runs and checks): for a bounded time
// it runs the real daemon binary as a child process against simulated
// vLLM engines over real ZeroMQ, hostile senders and a gRPC load,
// restarts engines and the daemon, and checks every answer for sanity,
// the index against the engines' true caches (Cache, computed from the
// engine's own state, never from the events it sent) whenever they pause,
// and that the daemon's memory and goroutines stay flat (FlatRule).
// Everything derives from one seed but the goroutines' interleaving.
//
// # Concurrency
//
// A Run starts one goroutine per engine, one each for the Score and Route
// load, the garbage sender, the sampler, the chaos schedule and the
// checkpoints. The chaos lock serialises engine restarts, daemon restarts
// and checkpoints, and is taken before any engine's lock; an engine's own
// lock is held for each of its steps, so holding every engine's lock
// pauses the fleet. The runner's mu is taken last.
package soak
