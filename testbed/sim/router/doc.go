// Package router holds the request routers kvsim compares, each knowing
// only what a real router of its kind could know:
//
//   - round-robin: engines in turn.
//   - least-loaded: fewest running + waiting requests (vLLM's metrics),
//     ties by KV-cache usage, then in turn.
//   - prefix-hash: consistent hashing (128 virtual nodes per engine) of
//     the prompt's first AffinityTokens tokens (default 1,024; the first
//     block alone would send all of Mooncake, whose requests share their
//     first 512 tokens, to one engine).
//   - approximate: GIE's approximate prefix-cache scorer (a router-side
//     LRU per engine of the block hashes routed there, blind to
//     evictions, scored matched/total over the first 256 blocks) plus its
//     queue scorer (min-max normalised waiting) and KV-utilisation scorer
//     (1 - usage), weighted 2:2:2 as GIE's example profile; ties at random.
//   - precise: kvindex's Score; longest match, ties by least load.
//   - precise+load: kvindex's Route, with Release when the prefill is
//     done. ModeClient ranks client-side instead: Score plus the router's
//     own in-flight prefill tokens, said in Note.
//   - ttft-greedy (formerly "oracle"): every engine's exact cache and
//     queue at the instant of decision; least estimated TTFT. A reference
//     for greedy routing with perfect knowledge, not a bound (package sim
//     computes the bounds).
//
// A Router is used by one simulation loop at a time.
package router
