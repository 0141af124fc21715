// Package soak is kvindex's soak test (testbed/cmd/kvsoak, `make soak`): for a
// bounded time it runs the real daemon binary as a child process against
// simulated vLLM engines over real ZeroMQ, hostile senders and a gRPC
// client, restarts engines and the daemon, and checks that every answer is
// sane, that the index is exactly what the engines hold whenever they pause,
// and that the daemon's memory and goroutines stay flat.
//
// # Truth
//
// Each simulated engine keeps its true cache in a Cache: physical blocks
// of chained content, evicted in vLLM's order at a fixed capacity (a
// request's blocks are freed last block first, so a chain's tail goes
// before its head), one BlockRemoved per evicted block, AllBlocksCleared
// from time to time. Answers are compared with Cache.LongestPrefix, which
// is computed from the engine's own state, never from the events it sent.
//
// # Checks
//
// At every checkpoint the engines pause, the soak waits until ListWorkers
// shows each worker's last seq equal to its engine's and health OK
// (last_seq moves once the index has applied the batch), then every
// Score of prompts built from the engines' caches must give every
// worker exactly the longest prefix its engine holds, and every worker's
// resident block count must equal its engine's. Between checkpoints every
// answer is checked for sanity (real workers only, bounds, codes). The
// daemon's VmRSS and go_goroutines are sampled; the run fails unless they
// are flat by the rule in FlatRule. Everything is derived from one seed:
// the same seed gives the same workloads, garbage and schedule (the
// interleaving of goroutines still differs run to run).
//
// # Concurrency
//
// A Run starts one goroutine per engine, one each for the Score and Route
// load, the garbage sender, the sampler, the chaos schedule and the
// checkpoints. A chaos lock serialises engine restarts, daemon restarts
// and checkpoints; an engine's own lock is held for each of its steps, so
// holding every engine's lock pauses the fleet.
package soak
