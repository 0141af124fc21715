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
// KV-cache groups (Config.Layout; vLLM's hybrid KV-cache manager, read in
// vllm-project/vllm: single_type_kv_cache_manager.py at 129ab7c,
// kv_cache_coordinator.py at 52b9a57, block_pool.py at c59cb79,
// kv_cache_manager.py at 003df29, sched/scheduler.py at 00024d3). A
// layout lists groups in group_idx order, all at the engine's block size
// (vLLM unifies a hybrid model's). Every group allocates its own blocks
// from the one pool of CacheBlocks, so a hybrid model holds a block per
// group at each position, and a block is cached under (hash, group).
// Per scheduled request, as allocate_slots: every group frees what it no
// longer needs, then every group allocates (evicting, group by group),
// then every group caches its filled positions. By kind:
//
//   - full_attention, mla_attention, sink_full_attention: every block
//     kept (sink blocks are not reserved).
//   - sliding_window(_mla), window w: before each step, positions wholly
//     before token computed-w+1 are freed, highest first, so they reach
//     the free queue long before the request ends and are evicted first.
//   - mamba ("align" mode): one state block, at the position of the
//     step's last token; the previous one is freed the next step. Prefill
//     chunks are cut to whole blocks, and to end at the sequence's last
//     block boundary (a running request with no whole block in the budget
//     waits a step, a waiting one stops admission), so a state is cached
//     only where a chunk ended on a boundary.
//
// Positions a group holds no block for are vLLM's null blocks: skipped
// from its BlockStored's block_hashes, their tokens kept in token_ids
// (the parent is the hash before the first new position). Each group's
// BlockStored carries group_idx, kv_cache_spec_kind and, for window kinds,
// kv_cache_spec_sliding_window; each BlockRemoved its group_idx. The zero
// Layout announces no group fields (vLLM before group_idx). A request's
// hit is HybridHit's; a finished or preempted request frees its blocks
// group by group, each in reverse order. Fits counts each group's peak.
//
// Preset layouts (Preset; kvsim --model-layout; the time model stays the
// 8B one below):
//
//   - llama: Llama-3.1-8B, one full_attention group of 16-token blocks,
//     without group fields: today's engine.
//   - deepseek: DeepSeek V2/V3/R1 and Kimi K2, MLA in every layer: one
//     mla_attention group; vLLM's MLA backends (FlashMLA) take 64-token
//     blocks.
//   - deepseek-v4: its MLA group, in the 256-token blocks vLLM runs it
//     with. Only that group: vLLM also gives DeepSeek-V4 a sliding-window
//     group of 64-token blocks and compressor-state groups of 4 and 8,
//     which one block size cannot hold.
//   - gemma3: Gemma 3 12B, 48 layers, every sixth global: 8 full-attention
//     and 40 local layers with a 1,024-token window. vLLM makes groups of
//     as many layers as the smallest kind has (8), in the order the kinds
//     first appear (layer 0 is local): groups 0-4 sliding_window (window
//     1024), group 5 full_attention; 16-token blocks.
//   - gpt-oss: gpt-oss-20b and -120b alternate a 128-token sliding window
//     (layer 0) and full attention in equal numbers: group 0
//     sliding_window (window 128), group 1 full_attention; 16-token blocks.
//   - qwen3-next: Qwen3-Next-80B-A3B, 48 layers, every fourth full
//     attention (12, 2 KV heads of 256) after three Gated DeltaNet layers
//     (36, mamba kind): groups of 12, mamba 0-2 then full_attention 3. vLLM
//     raises the block size until an attention page holds a mamba state:
//     16 x cdiv(state bytes, 16 x attention bytes per token). At tensor
//     parallel 2 in bf16 a state is 524,288 + 24,576 bytes and a token
//     1,024: 544 tokens. Prefix caching in "align" mode.
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
