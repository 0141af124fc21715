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
// cache_aware (the default) ranks by least cost, as its guard says:
//
//	guard ttft (default): the estimated time to first token of this
//	    request on w, plus the delay its prefill adds to the requests that
//	    will queue behind it, from one cost model (CostModel:
//	    prefill rate, step overhead, cost per decoding request and per
//	    context token, step token budget, KV capacity; DefaultCostModel is
//	    an 8B model on one H100; Calibrate fits it from vLLM's metrics):
//	      step_w   = overhead + running_w x per_seq + context_w x per_token
//	                 (context_w = KV usage x capacity)
//	      wait_w   = ceil(queue_w / budget_w) x step_w + queue_w / rate
//	      prefill_w = the further steps for own_w, + own_w / rate
//	      pressure_w = (own_w - free KV_w) / rate, if positive
//	      delay_w  = prefill_w x a_w x (wait_w + prefill_w) / (1 - rho)
//	      evict_w  = min(own_w, occupied_w + own_w - capacity) x h / rate,
//	                 if positive (occupied: resident blocks plus KV in use;
//	                 h: the fleet's hit rate)
//	      relief_w = max over sampled prefix depths d that w does not hold
//	                 and a_d / h_d > a / workers (hot: the prefix brings its
//	                 holders more than a worker's share) of
//	                 a_d / (h_d + 1) x t_d / (1 - rho) x (t_d - ttft_w) / 2,
//	                 if positive
//	    with a the model's routed requests per second, rho = (a / workers)
//	    x average uncached prefill / rate (Route's own accounting), a_d
//	    the rate of requests sharing the prompt's first d blocks (Route
//	    counts them at about 2 log2(B) depths in a fixed table), h_d the
//	    workers holding those d blocks and t_d the least TTFT among them,
//	    and a_w = a / workers or, if larger, the largest over depths d that w holds of
//	    (a - a_d) / workers + a_d / h_d: a prefix's requests divide among
//	    its holders, the rest spread evenly. delay_w counts the requests
//	    that arrive during the backlog's busy period (M/G/1) and wait for
//	    this prefill; evict_w the later recompute of what the request's
//	    new blocks push out of a full cache; relief_w what caching the
//	    prompt on one more worker saves the later requests sharing a
//	    prefix whose holders queue. cost_w = wait_w + prefill_w +
//	    pressure_w + delay_w + evict_w - relief_w, in seconds. At low load
//	    delay and relief vanish: the request spills from its cached worker
//	    exactly when the wait there exceeds recomputing the prefix
//	    elsewhere. Under load a recompute costs everyone behind it, and
//	    prompts stay where they are cached for longer, unless many
//	    requests share the prefix: its holders receive more than their
//	    share (a_w) and a copy elsewhere divides them (relief_w), so a hot
//	    prefix replicates and a cold one (a conversation's own history)
//	    stays single. A waiting request of unknown size counts as
//	    the average uncached prefill. Cost: about 85 ns per candidate more
//	    than the token cost, no allocation (docs/benchmarks.md); sorting
//	    dominates both.
//	guard cost: cost_w = own_w + load_weight * queue_w, with
//	    load_weight 1/3: an uncached token is paid by this request and
//	    again by the requests queued behind it.
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
// ttft is the default because it is a model of the engine, not a hand-set
// weight: its parameters are measurable. The static rule counts requests,
// not work, and diverts constantly when prompts share a prefix. The
// guards' measurements: guard_test.go, docs/results.md, docs/benchmarks.md.
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
// probe (see Scorer and Tracker). Route holds its model's route lock from
// rank to record, so a model's Routes are decided one at a time, each with
// the speculative blocks and in-flight load of those before it (a burst
// for one new prefix computes it once per worker chosen, not once per
// route ranked at the same instant); Routes of different models, and
// Scores, run in parallel. A Result belongs to one goroutine.
package scoring
