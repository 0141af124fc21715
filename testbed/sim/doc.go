// Package sim is kvsim, kvindex's fleet simulator: it replays a workload
// (package workload) through simulated vLLM engines (package engine) once
// per router (package router), on the same arrivals, and reports hit
// rates, prefill work, TTFT percentiles, throughput and load skew per
// router (package metrics) beside the workload's bounds (ComputeBounds).
// Analyze does the same for a user's request log; RunGrid runs the
// workload suite's grid and evaluates precise+load's criterion per cell.
//
// Both modes run one discrete-event loop: arrivals are routed and queued
// on an engine, engines run steps the time model times, and each step's
// KV events form one batch. A router that scrapes vLLM's metrics
// (router.Poller) sees them as of its last poll, every poll interval of
// simulated time; one that counts its own requests in flight
// (router.Finisher) hears when each finishes.
//
//   - Virtual time (Simulate, Sweep): time jumps from event to event. The
//     kvindex routers still use kvindex's real pipeline in process: each
//     batch is encoded as vLLM sends it, decoded and applied to the index
//     at its virtual time (plus Options.EventLag), routers call the
//     scorer the gRPC server answers with, and kvindex's route tracker
//     runs on the virtual clock.
//   - Live (Live): the loop follows the wall clock (LiveOptions.Speedup);
//     engines publish over real ZeroMQ to the real daemon (or a fleet of
//     agents and replicas), routers ask it over real gRPC, and each
//     router's call is charged to its request's TTFT.
//
// When a run ends every KV-cache group of every kvindex worker must hold
// exactly the distinct blocks its engine caches in that group, and no
// event may have been refused, orphaned or lost; anything else is counted
// in metrics.Result.IndexProblems and named, by kind, in IndexDetail
// (check.go).
//
// Simulate and Sweep run one goroutine per router (Options.Parallel at
// once), Live every router at once; each run owns its fleet, index and
// router, and shares the read-only workload.
package sim
