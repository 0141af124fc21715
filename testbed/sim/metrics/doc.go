// Package metrics records each request of a simulation and reduces the
// record to the numbers kvsim reports per router:
//
//   - token hit rate: prompt tokens found in the prefix cache when the
//     request was first scheduled, over all scheduled prompt tokens;
//     request hit rate: the share of scheduled requests hitting a block.
//   - prefill tokens: prompt tokens computed, recomputation included.
//   - TTFT: first token minus arrival (in live mode the router's latency
//     included); percentiles are nearest-rank (value ceil(p/100*n)).
//   - throughput: completions (and output tokens) per second of makespan,
//     first arrival to last completion.
//   - load skew: max over mean of the engines' prefill tokens; request
//     skew the same over requests routed.
//   - prediction error (routers that ask kvindex): per request, the hit
//     kvindex predicted on the engine it chose (its matched tokens, at
//     most the prompt's full blocks before its last token) against the
//     engine's hit when first scheduled: mean absolute error in tokens,
//     the share exact, the share over-predicted.
//   - estimate error (precise+load in virtual time): per request, the
//     TTFT kvindex's cost model estimated on the engine Route chose
//     against the TTFT: the mean of each, the mean absolute error, the
//     share within 25%, and for estimates of a second or more (a queue)
//     the TTFT over the estimate, which tells a queue that drained slower
//     than the model's prefill rate (memory, preemption) from one it
//     modelled.
//
// A Recorder is used by one simulation loop.
package metrics
