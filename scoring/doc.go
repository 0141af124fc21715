// Package scoring turns per-worker prefix matches from the indexer, and
// what is known of each worker's load, into a ranking: which worker should
// take a request. Scorer is the one entry (the gRPC API, the simulator and
// in-process routers call it): it matches a prompt in the index, merges the
// speculative blocks of recent routes, reads each worker's load and ranks
// by a Policy. Tracker keeps the routing decisions: speculative residency
// for the blocks a routed request is about to create, and in-flight load
// until the request is released.
//
// # The formula
//
// For a prompt of T tokens in B blocks of size S, and a worker w:
//
//	cached_w  = the worker's consecutive resident prefix, each block
//	            weighted by tier (Policy.Weights: GPU 1.0, CPU 0.8,
//	            STORAGE, DISK, EXTERNAL 0.5, OTHER 0, set per tier by
//	            tier_weights; a REMOTE block is EXTERNAL; media in
//	            descending weight, each adding the part of its prefix not
//	            already counted), times S tokens, as far as every
//	            KV-cache group serves it (the hybrid cap); blocks a
//	            recent Route sent there, past those its prefix group
//	            holds, count as GPU
//	overlap_w = cached_w / (B * S)
//	own_w     = T - cached_w                          (tokens to prefill)
//	queue_w   = caller's queued_prefill_tokens if given, else
//	            max(in-flight prefill tokens routed here,
//	                waiting requests * average prompt tokens)
//
// cache_aware (the default) ranks by least cost, as its guard says:
//
//	guard ttft (default): the estimated time to first token on w plus the
//	    delay its prefill adds to the requests that queue behind it, from
//	    one CostModel (prefill rate, step overhead, cost per decoding
//	    request and per context token, step budget, max_num_seqs, KV
//	    capacity):
//	      step_w   = overhead + running_w x per_seq + context_w x per_token
//	                 (context_w = KV usage x capacity)
//	      wait_w   = ceil(queue_w / budget_w) x step_w + queue_w / rate
//	                 + max(0, busy_w + 1 - max_num_seqs) x workers / a
//	                 (busy_w: requests running and waiting; a full engine
//	                 admits one as another finishes, a / workers a second)
//	      prefill_w = the further steps for own_w, + own_w / rate
//	      pressure_w = (own_w - free KV_w) / rate, if positive
//	      delay_w  = prefill_w x a_w x (wait_w + prefill_w) / (1 - rho)
//	      evict_w  = min(own_w, occupied_w + own_w - capacity) x h / rate,
//	                 if positive (occupied: the pool blocks held, every KV-cache group's, plus KV in use;
//	                 h: the fleet's hit rate)
//	      relief_w = max over sampled prefix depths d that w does not hold
//	                 and a_d / h_d > a / workers (a hot prefix) of
//	                 a_d / (h_d + 1) x t_d / (1 - rho) x (t_d - ttft_w) / 2,
//	                 if positive
//	    with a the model's routed requests per second, rho = (a / workers)
//	    x average uncached prefill / rate, a_d the rate of requests sharing
//	    the prompt's first d blocks (counted at about 2 log2(B) depths),
//	    h_d the workers holding them and t_d the least TTFT among those,
//	    and a_w the larger of a / workers and, over depths d that w holds,
//	    (a - a_d) / workers + a_d / h_d. cost_w = wait_w + prefill_w +
//	    pressure_w + delay_w + evict_w - relief_w, in seconds. delay_w
//	    counts the requests arriving in the backlog's busy period (M/G/1);
//	    evict_w the later recompute of what the request pushes out of a
//	    full cache; relief_w what a copy on one more worker saves the later
//	    requests of a hot prefix whose holders queue. At low load the
//	    request spills from its cached worker exactly when the wait there
//	    exceeds recomputing the prefix elsewhere; under load prompts stay
//	    where they are cached, unless a prefix is hot, which then
//	    replicates. A waiting request of unknown size counts as the average
//	    uncached prefill. Cost: about 85 ns a candidate over guard cost.
//	guard cost: cost_w = own_w + load_weight * queue_w, load_weight 1/3.
//	guard static: cost_w = own_w, and a worker with more than static_k
//	    (2) times the median in-flight requests is ranked after every other
//	    worker, penalised by T.
//	guard off: cost_w = own_w.
//	score_w = -cost_w
//
// longest_prefix ranks by overlap_w (score_w = overlap_w), ties by
// queue_w. Ties in cost go to the less busy worker (running + waiting as
// the engine reports them, or the requests kvindex routed there, whichever
// is larger), then lower KV usage; then every policy prefers more GPU
// blocks, then the worker name, so equal answers are stable.
//
// ttft is the default because its parameters are measurable, not hand-set
// weights; the static rule counts requests, not work, and diverts
// constantly when prompts share a prefix (guard_test.go, docs/results.md).
//
// # Load sources
//
// Load comes from the request (RequestLoad), else from each engine's
// scraped vLLM metrics (scrapes older than three intervals are ignored),
// plus kvindex's own in-flight accounting of Route decisions.
//
// # Concurrency
//
// A Policy is a value; Rank writes only the candidates it is given. Scorer,
// Tracker and LoadBoard are safe for concurrent use; a Score takes no lock
// but one tracker shard's read lock. Route holds its model's route lock
// from rank to record, so a model's Routes are decided one at a time, each
// seeing the speculative blocks and load of those before it (a burst for a
// new prefix stays together); Routes of different models, and Scores, run
// in parallel. A Result belongs to one goroutine.
package scoring
