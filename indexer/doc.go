// Package indexer is kvindex's source of truth: which KV-cache blocks each
// worker holds, on which medium, right now.
//
// # Keys
//
// kvindex never relies on engines' own block hashes matching anything
// outside the engine (they depend on a hash algorithm and seed the router
// cannot see). Instead it derives its own content Key per block: a 64-bit
// xxh3 hash chained from the parent block's key over the block's token ids
// and its extra keys (LoRA name, multimodal identifiers, cache_salt), from a
// root that names the model and adapter. PromptKeys computes the same keys
// from a request's tokens, so a prompt and the engine's blocks meet on equal
// keys, and different models or adapters never mix.
//
// Each Worker keeps a map from engine hash to content key, which resolves
// BlockRemoved events and parent_block_hash (both name engine hashes only).
// Stores are reference counted per (key, worker, medium): vLLM may store a
// block twice, and each store needs its own removal.
//
// # Events that cannot be applied exactly
//
// Nothing is dropped silently. A BlockStored whose parent is unknown is
// indexed under keys derived from the missing parent (so its removals and
// descendants still resolve, but no prompt can match it) and counted as
// orphans; block-size mismatches, token counts that do not cover the
// blocks, removals of blocks never stored and unknown media are counted per
// worker and reported to the caller. Events of KV-cache groups that do not
// decide prefix reuse (sliding window, mamba) are counted and not indexed.
//
// # Concurrency
//
// Index and Worker are safe for concurrent use; see Index for the locking
// and its cost.
package indexer
