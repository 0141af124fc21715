// Package engine is a simulated vLLM engine: a KV block pool managed the
// way vLLM's prefix cache manages it, a step scheduler with continuous
// batching and chunked prefill, a time model for each step, and the KV
// events vLLM would publish, as events.Batch values.
//
// # Prefix cache (vLLM v1 BlockPool and KVCacheManager)
//
//   - The pool has Config.CacheBlocks blocks of Config.BlockSize tokens. A
//     block is cached (has a hash, can be hit) once it is full. Block
//     hashes are chained over the block's content and the parent's hash,
//     seeded per engine (vLLM's hashes depend on its seed, so they are
//     opaque ids that never compare across engines).
//   - A new request looks up its longest cached prefix of full blocks, at
//     most (tokens - 1) / BlockSize blocks (vLLM always computes at least one
//     token). A hit takes a reference on the block and emits nothing.
//   - Allocation pops the least recently freed block from the free queue;
//     if it is cached it is evicted then (lazily), emitting one BlockRemoved
//     for that one block.
//   - When blocks become full during scheduling (a prefill chunk, or a
//     decode step that completes a block of generated tokens) they are
//     cached and announced in one BlockStored per request per step, with
//     the parent hash (nil for block 0), the blocks' token ids and
//     block_size. The same content can be stored twice (two requests that
//     computed it concurrently); both copies are announced and evicted
//     separately.
//   - When a request finishes (or is preempted) its blocks are freed in
//     reverse order, so that a request's last blocks are evicted before its
//     first ones; freed blocks keep their hash until reused.
//
// Events of one step form one batch, published when the step ends (vLLM
// publishes from update_from_output), in the order they happened.
//
// # Scheduler (vLLM v1 Scheduler, simplified)
//
// Each step has a token budget of MaxBatchedTokens. Running requests go
// first, in arrival order: a decoding request takes 1 token, a prefilling
// one the rest of its prompt up to the budget (chunked prefill). When a
// running request cannot get the blocks it needs, the last running request
// is preempted (its blocks freed, its progress lost; it goes back to the
// head of the queue and recomputes, hitting what is still cached). Then,
// if nothing was preempted, waiting requests are admitted first come first
// served while the budget, MaxNumSeqs and free blocks allow; the queue
// head blocks the rest. A request whose whole sequence could never fit in
// the cache is rejected on arrival.
//
// # Time model
//
// A step that prefills p tokens, attending over a (new token, context
// token) pairs, and decodes d requests with a total context of c tokens
// takes
//
//	StepOverhead + p/PrefillTokensPerSec + a/AttentionPairsPerSec
//	    + d*DecodePerSeq + c*DecodePerContextToken
//
// A prefill chunk of n tokens after k computed (or cached) ones attends
// over n*k + n*(n+1)/2 pairs: prefill slows with the context already
// cached and quadratically with a long prompt, as flash attention does.
//
// The defaults describe an 8B model (Llama-3.1-8B, bf16) on one H100 80GB:
//
//   - PrefillTokensPerSec 17,500: the weights' 2 x 8e9 FLOPs per token at
//     28% of the H100's 989 dense bf16 TFLOP/s (GEMMs, norms, sampling and
//     scheduling together).
//   - AttentionPairsPerSec 9.4e8: a (query, key) pair costs 4 x 32 layers
//     x 32 heads x 128 dims = 524,288 FLOPs (QK and AV), at 50% of peak,
//     what FlashAttention-3 reaches for bf16 on H100. With the linear
//     part, a 10,000-token prompt prefills at 16,000 tokens/s (the linear
//     model this replaces, whose rate was set for ~10k contexts), a
//     2,000-token one at 17,200 and a 128,000-token one at 8,000:
//     published measurements of 8B prefill on one H100 fall around
//     10-20k tokens/s at moderate lengths and well below at 100k+. These
//     are derived from FLOPs and stated efficiencies, not fitted to a
//     measured curve; scoring.Calibrate fits a real engine's.
//   - StepOverhead 6 ms: reading 16 GB of weights at 3.35 TB/s takes
//     4.8 ms per forward pass, plus scheduling and sampling; vLLM's
//     inter-token latency for 8B at batch 1 on H100 is about 6-8 ms.
//   - DecodePerSeq 0.1 ms and DecodePerContextToken 39 ns: each decoding
//     request reads its KV cache every step, 128 KiB per token for
//     Llama-3.1-8B (32 layers x 8 KV heads x 128 dims x 2 (K,V) x 2 bytes)
//     at 3.35 TB/s.
//   - CacheBlocks 25,000 blocks of 16 tokens (400k tokens, 52 GB of KV):
//     80 GB at gpu_memory_utilization 0.9 minus 16 GB of weights and
//     activation headroom.
//   - MaxNumSeqs 256 and MaxBatchedTokens 8,192: vLLM's max_num_seqs and a
//     common max_num_batched_tokens for chunked prefill.
//
// A request's time to first token is its queueing time plus the steps
// that prefill its uncached tokens: it ends with the step that computes
// its last prompt token. Everything is configurable (Config, TimeModel).
//
// # Concurrency
//
// An Engine is not safe for concurrent use: one simulation loop drives it.
package engine
