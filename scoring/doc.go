// Package scoring turns per-worker prefix matches from the indexer, and
// what is known of each worker's load, into a ranking: which worker should
// take a request. Scorer is the one entry: it matches a prompt in the
// index, merges the speculative blocks of recent routes, lists cold
// workers when asked, reads each worker's load and ranks by a Policy; the
// gRPC API, the simulator and in-process routers all call it. It also
// keeps the routing decisions themselves (Tracker): speculative residency
// for blocks a routed request is about to create, and in-flight load until
// the request is released.
//
// # The formula
//
// For a prompt of T tokens in B blocks of size S, and a worker w:
//
//	cached_w  = sum over the worker's consecutive resident prefix of the
//	            tier weight of each block: GPU 1.0, CPU 0.8, STORAGE, DISK,
//	            EXTERNAL 0.5 (media taken in descending weight, each adding
//	            the part of its prefix not already counted), times S tokens;
//	            blocks a recent Route sent there count as GPU
//	overlap_w = cached_w / (B * S)
//	own_w     = T - cached_w                          (tokens to prefill)
//	queue_w   = caller's queued_prefill_tokens if given, else
//	            max(in-flight prefill tokens routed here,
//	                waiting requests * average prompt tokens)
//
// cache_aware (the default) ranks by least cost:
//
//	guard cost (default): cost_w = own_w + load_weight * queue_w, with
//	    load_weight 1/3: an uncached token is paid by this request and
//	    again by the requests queued behind it, so a worker's cache is
//	    passed over only when its queue outweighs three times the prefill
//	    it saves.
//	guard static: cost_w = own_w, and a worker with more than static_k
//	    (2) times the median in-flight requests is diverted: ranked after
//	    every other worker, penalised by T.
//	guard off: cost_w = own_w.
//	score_w = -cost_w
//
// longest_prefix ranks by overlap_w (score_w = overlap_w) and breaks ties
// by queue_w. Every policy breaks remaining ties by more GPU blocks, then by
// worker name, so equal answers are stable.
//
// Which guard is the default was measured (guard_test.go, and kvsim in
// docs/results.md): on steady Zipf-skewed traffic both guards cut p99 TTFT
// 6-25x against affinity alone and stay within 15% of each other (static
// ahead with very small or very large caches); on a burst sharing a new
// prefix the static rule scatters the burst after two requests and
// recomputes the prefix, while the cost rule keeps it on one worker; on
// the Mooncake trace the static rule diverts constantly (6.5% of tokens
// cached, p99 TTFT 7.9 s) where the cost rule keeps 13.5% and 5.4 s. The
// cost rule is the default.
//
// Ties in cost (a prompt cached nowhere) go to the less busy worker:
// running + waiting requests as the engine reports them, or the requests
// kvindex routed there, whichever is larger; then lower KV cache usage.
//
// # Load sources
//
// Load comes from the request (WorkerLoad), from each engine's scraped
// vLLM metrics (num_requests_running, num_requests_waiting,
// kv_cache_usage_perc; scrapes older than three intervals are ignored),
// and from kvindex's own in-flight accounting of Route decisions, in that
// order of precedence for running/waiting; in-flight accounting always
// adds.
//
// # Concurrency
//
// A Policy is a value; Rank reads only the policy and writes only the
// candidates it is given, so one Policy may rank for many goroutines at
// once. Scorer, Tracker and LoadBoard are safe for concurrent use; on the
// Score path, per-worker load and in-flight counts are atomic loads, and
// the only lock taken is one tracker shard's read lock for the speculative
// probe (see Scorer and Tracker). A Result belongs to one goroutine.
package scoring
