// Package chaos runs kvindex's fleet under seeded fault schedules
// (testbed/cmd/kvsoak chaos, `make chaos`; docs/reliability.md, "Chaos").
//
// A run is one seed. It starts a fleet on loopback: two simulated engines
// inside the harness (vLLM's wire format with a replay buffer, and the
// true caches that are the checks' oracle), nats-server with JetStream,
// and kvindex agent (with its checkpoint) beside each engine and two or
// three kvindex serve replicas as child processes. Every path between an
// agent and its engine, and between every process and NATS, goes through
// a toxiproxy link in the harness (Net). The seed draws the schedule
// (Schedule, a pure function of the seed and the Plan): link faults
// (latency and jitter, bandwidth caps, resets, one-way black holes,
// partitions, links down), process faults (SIGKILL or SIGTERM and a
// restart, SIGSTOP and SIGCONT, of agents, replicas and nats-server) and
// engine faults (a restart with seq from 0 and an empty cache, a freeze).
// Meanwhile a router scores and routes prompts on the replicas, sends
// routed requests to the chosen engine and releases them.
//
// Four invariants are checked while the faults run, not only at the end
// (Invariants): (a) every answer against the engines' truth, a stale
// credit allowed only within the replica's measured lag or the stated
// detection bound, or flagged; (b) once the faults stop, every replica's
// and agent's digest equal to its engine's cache within a bound, and
// every restarted agent resumed from its checkpoint; (c) memory,
// goroutines and queue depths under bounds, no goroutine leak; (d) no
// panic, no unasked exit, no deadlock (a watchdog dumps a process that
// stops answering with SIGQUIT and names its stuck goroutines). A failing
// seed prints the command that replays it, its schedule and the first
// invariant broken (Summary.Report).
//
// # Concurrency
//
// A run starts a goroutine per engine (its steps), the Score and Route
// loops, the sampler, the process watchdog, the schedule's runner and a
// goroutine per fault; releases and restarted agents' checks run on their
// own. run.mu guards the run's records (violations, counts, the faults in
// effect); an engine's, a child's, the checker's and the usage records'
// own mutexes guard theirs. None is held while another is taken.
package chaos
