// Package sim is kvsim, kvindex's fleet simulator: it replays a workload
// (package workload) through a fleet of simulated vLLM engines (package
// engine) once per router (package router), on the same arrivals, and
// reports hit rates, prefill work, TTFT percentiles, throughput and load
// skew per router (package metrics), as tables, CSV and SVG charts
// (package chart), beside the bounds the workload sets for any router
// (ComputeBounds: the hit rate of an infinite cache, the TTFT of
// prefilling alone). Analyze does the same for a user's own request log,
// with its reuse ceiling and a verdict. RunGrid runs the workload suite
// (GridWorkloads) at each rate and cache size and evaluates precise+load's
// criterion on every cell (EvaluateCriterion).
//
// # Two modes, one loop
//
// Both modes run the same discrete-event loop: arrivals are routed and
// queued on an engine, each engine runs steps whose duration the time
// model gives, and each step's KV events form one batch.
//
//   - Virtual time (Simulate, Sweep): time jumps from event to event, so the
//     full 12,031-request Mooncake trace runs through 8 engines for all
//     seven routers in seconds. The kvindex routers still use kvindex's real
//     pipeline, in process: each batch is encoded with events.AppendPayload
//     exactly as vLLM sends it, decoded with events.Decoder and applied with
//     indexer.Worker.ApplyBatch, at the virtual time it is published (plus
//     Options.EventLag); routers call api.Server's Score and Route methods
//     directly, and kvindex's route tracker runs on the virtual clock.
//   - Live (Live): the loop waits for the wall clock (scaled by
//     LiveOptions.Speedup). Engines publish over real ZeroMQ sockets
//     (enginepub.Publisher) to the real daemon (daemon, started in
//     process, or an external one), and the kvindex routers ask it over real
//     gRPC (api.Client). Each router's call is charged to its request's
//     TTFT on the wall clock (the request reaches its engine that much
//     later), so live and virtual differ by the real routing latency.
//
// Either way, when a run ends every kvindex worker must hold exactly the
// blocks its engine has cached; anything else is counted in
// metrics.Result.IndexProblems and reported.
//
// # Concurrency
//
// Simulate and Sweep run one goroutine per router (at most
// Options.Parallel at once); Live runs every router at once. Each run owns
// its fleet, index and router; the workload is shared read-only.
package sim
