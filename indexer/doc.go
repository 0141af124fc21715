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
// # Structure
//
// Because every key is chained from one parent, the keys of all workers
// form a tree. The index stores it path-compressed, radix style: a node
// holds a run of consecutive keys, and segments that give each stretch of
// the run its holder set, a sorted list of (worker, media bitmask) shared,
// immutably, by every key of the stretch. A branch is a child node attached
// at any key of its parent's run; heads, a map sharded by key, finds a node
// by its first key. A prompt is matched by comparing its keys with a run
// one after another, looking at a holder set only where it changes, and
// probing heads only where the prompt leaves a node; so Match costs
// O(matched keys + holders of the first key + holder-set changes), not one
// hash probe and O(holders) per block, and a prefix of 512 blocks held by
// 1,000 workers is one node, one segment and one 4,000-byte set.
//
// Each Worker keeps a map from engine hash to the block's place in the
// tree and its per-medium store counts: vLLM may store a block twice, and
// each store needs its own removal. The tree records only which media a
// worker holds a key in, so that holder sets stay shareable.
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
// Blocks dropped for the capacity or the memory budget are counted as
// evictions.
//
// # Replication
//
// A worker's resident set can be replicated into another index, which
// sees only content keys: Worker.ApplyBatchDelta records what each batch
// did as a Delta; a keyed worker (WorkerInfo.Keyed) is built from a
// Snapshot by Worker.Restore and then applies the deltas after it with
// Worker.ApplyDelta, holding the same keys in the same media at the same
// places, so Match answers for it as for the source; Worker.Digest proves
// the resident sets equal. An effect that does not fit is counted and
// reported (ErrDeltaMismatch), for the caller to restore anew.
//
// Worker.Checkpoint saves a worker fed engine events whole (the snapshot's
// keys plus every engine block, its stores and recency, and the learned
// state), for a restarted fleet agent to go on feeding it the same
// engine's events after Worker.RestoreCheckpoint.
//
// # Concurrency
//
// Index and Worker are safe for concurrent use; Match takes no lock on the
// tree and records no recency. Lock order and what Match may wait on: see
// Index.
//
// # Memory
//
// Measured with BenchmarkMemory10M (heap after GC, 10 M (block, worker)
// residencies: 1,000 workers x 10,000 blocks), all in, 23.4 bytes per
// residency in a realistic fleet (shared system prompts, conversations on
// one or two workers) and 27.8 bytes when no block is shared at all. Of
// that, the residency index costs 5.4 and 9.7 bytes (8 per key, shared by
// the key's holders, and runs grown by an eighth at a time); the workers'
// engine maps cost 18 bytes per block (blockmap: a 16-byte slot in a
// cuckoo table kept 83-94% full, the entry packed into 7 bytes of it), and
// hold no pointers, so the garbage collector does not scan them.
//
// Memory is bounded twice. Each worker holds at most its capacity of
// blocks (configured, or learned from the engine's first removals; see
// Worker), which bounds what lost removals can leave behind; and
// Config.MemoryBudget bounds the estimated total, evicting from the
// workers that hold the most. Evictions are counted per worker; no cap
// limits how many workers may hold one block.
package indexer
