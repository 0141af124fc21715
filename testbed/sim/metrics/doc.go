// Package metrics records what happened to each request of a simulation
// and reduces it to the numbers kvsim reports per router.
//
// # Definitions
//
//   - Hit rate by tokens: prompt tokens found in the engine's prefix cache
//     when the request was first scheduled, over all prompt tokens of
//     scheduled requests. Only prefix reuse counts.
//   - Hit rate by requests: the fraction of scheduled requests that hit at
//     least one block.
//   - Prefill tokens: prompt tokens the engines computed, recomputation
//     after preemption included.
//   - TTFT: first token time minus arrival. In live mode the request
//     reaches its engine when the router has answered, on the wall
//     clock, so the router's latency (kvindex's gRPC round trip and
//     ranking) is part of TTFT; virtual time routes instantly. Percentiles are nearest-rank:
//     the p-th percentile of n sorted values is value ceil(p/100*n)
//     (1-based).
//   - Throughput: completed requests (and their generated tokens) per
//     second of makespan, from the first arrival to the last completion.
//   - Load skew: max over mean of the engines' prefill tokens computed
//     (1.0 is perfectly even); request skew is the same over requests
//     routed.
//
// A Recorder is used by one simulation loop; Results are plain values.
package metrics
