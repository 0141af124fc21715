// Package engine is a simulated vLLM engine: a KV block pool managed as
// vLLM's prefix cache manages it, a step scheduler with continuous
// batching and chunked prefill, a time model per step, and the KV events
// vLLM would publish, as events.Batch values.
//
// Prefix cache (vLLM v1 BlockPool and KVCacheManager): a block is cached
// once full; hashes chain over content and the parent's hash, seeded per
// engine, so they never compare across engines. A request hits its
// longest cached prefix of full blocks, at most (tokens-1)/BlockSize
// blocks (vLLM computes at least one token); a hit emits nothing.
// Allocation pops the least recently freed block, evicting it lazily (one
// BlockRemoved per block). Blocks that fill during a step are announced in
// one BlockStored per request per step (parent hash, token ids,
// block_size); content stored twice is announced and evicted twice. A
// request's blocks are freed in reverse order, its tail evicted first.
// A step's events form one batch, published when the step ends.
//
// Scheduler (vLLM v1, simplified): each step has MaxBatchedTokens of
// budget. Running requests go first, in arrival order (decode 1 token,
// prefill up to the budget); one that cannot get blocks preempts the last
// running request, which loses its progress and goes back to the queue's
// head. Then, if nothing was preempted, waiting requests are admitted
// FIFO while budget, MaxNumSeqs and free blocks allow. A request that
// could never fit the cache is rejected on arrival.
//
// Time model: a step prefilling p tokens over a (new, context) token
// pairs and decoding d requests of c context tokens in all takes
//
//	StepOverhead + p/PrefillTokensPerSec + a/AttentionPairsPerSec
//	    + d*DecodePerSeq + c*DecodePerContextToken
//
// where a chunk of n tokens after k computed ones attends over
// n*k + n*(n+1)/2 pairs. Defaults: an 8B model (Llama-3.1-8B, bf16) on one
// H100 80GB, derived from FLOPs and stated efficiencies, not fitted
// (scoring.Calibrate fits a real engine's):
//
//   - PrefillTokensPerSec 17,500: 2 x 8e9 FLOPs a token at 28% of 989 dense
//     TFLOP/s.
//   - AttentionPairsPerSec 9.4e8: 524,288 FLOPs a pair (4 x 32 layers x 32
//     heads x 128 dims) at 50% of peak (FlashAttention-3). A 2k-token
//     prompt prefills at 17,200 tokens/s, 10k at 16,000, 128k at 8,000.
//   - StepOverhead 6 ms: 16 GB of weights read at 3.35 TB/s (4.8 ms) plus
//     scheduling; DecodePerSeq 0.1 ms; DecodePerContextToken 39 ns: 128 KiB
//     of KV a token (32 layers x 8 KV heads x 128 dims x 2 x 2 bytes) read
//     at 3.35 TB/s.
//   - CacheBlocks 25,000 of 16 tokens (52 GB of KV at
//     gpu_memory_utilization 0.9); MaxNumSeqs 256; MaxBatchedTokens 8,192.
//
// A request's TTFT is its queueing plus the steps prefilling its uncached
// tokens. An Engine is driven by one simulation loop.
package engine
