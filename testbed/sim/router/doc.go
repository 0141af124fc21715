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
//   - the peers (peers.go), the routers a team would deploy instead, each
//     in its own file citing the repository, path and version it follows,
//     with its defaults and only the signals it has: llm-d (the default
//     profile: an approximate prefix LRU of 64-token blocks, queue and KV
//     utilisation scorers, 3:2:2, vLLM metrics polled every 50 ms),
//     llm-d-precise (the precise guide: prefix from KV events 2, KV
//     utilisation 1, queue 1), dynamo (Dynamo's KV router: uncached
//     prefill blocks plus active decode blocks from its own bookkeeping),
//     sglang (SGLang's gateway, cache_aware: an approximate radix tree,
//     shortest queue when imbalanced) and aibrix (AIBrix's prefix-cache
//     policy: a shared table of block hashes, load within mean + 1 std).
//     Where a peer reads KV events, kvindex's exact index answers for it.
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
