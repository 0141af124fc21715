// Package router holds the request routers kvsim compares. Each picks an
// engine for a request from what a real router of its kind could know:
//
//   - round-robin: nothing; engines in turn.
//   - least-loaded: each engine's running + waiting requests (vLLM's
//     num_requests_running/num_requests_waiting metrics), ties by KV-cache
//     usage, then in turn.
//   - prefix-hash: consistent hashing (128 virtual nodes per engine) of the
//     prompt's first AffinityTokens tokens (default 1,024). Hashing only
//     the first block would send every Mooncake request to one engine:
//     they all start with the same 512-token block.
//   - approximate: the Gateway API Inference Extension's approximate
//     prefix-cache scorer: a router-side LRU per engine of the block hashes
//     it routed there (it never sees evictions), scored as matched/total
//     of the first MaxBlocks blocks, plus its queue scorer (min-max
//     normalised waiting requests) and KV-cache-utilisation scorer
//     (1 - usage), weighted 2:2:2 as in GIE's example profile; the best
//     total wins, ties at random.
//   - precise: kvindex's Score; the longest matched prefix wins, ties by
//     least load (running + waiting), then KV usage, then in turn.
//   - precise+load: kvindex's Route (its cache- and load-aware ranking),
//     with Release when the prefill is done, so that kvindex counts the
//     request as in flight and its blocks as speculatively cached until
//     the engine's events confirm them. While kvindex answers Route with
//     Unimplemented, it falls back to Score plus the same cost computed
//     client-side (uncached tokens plus the router's own in-flight prefill
//     tokens on the engine) and says so in Note.
//   - ttft-greedy (formerly "oracle"): reads every engine's cache and
//     queue exactly, at the instant of the decision (no event delay), and
//     picks the least estimated time to first token (exact queued prefill
//     plus its own uncached prefill): what greedy routing reaches with
//     perfect knowledge. A reference, not a bound: precise, ignoring load,
//     can hit more, and a router that weighs what a prefill costs the
//     requests behind it can have a lower tail. The bounds (offline hit
//     rate with an infinite cache, TTFT with no queueing) are computed
//     by package sim, not routed.
//
// # Concurrency
//
// A Router is used by one simulation loop at a time; routers are not safe
// for concurrent use.
package router
