// Package indexer is kvindex's source of truth: which KV-cache blocks each
// worker holds, on which medium, right now.
//
// # Keys
//
// Engines' own block hashes depend on a hash algorithm and seed the router
// cannot see, so kvindex derives its own content Key per block: a 64-bit
// xxh3 hash chained from the parent block's key over the block's token ids
// and extra keys (LoRA name, multimodal identifiers, cache_salt), from a
// root that names the model and adapter. PromptKeys computes the same keys
// from a request's tokens; different models or adapters never mix.
//
// # Structure
//
// Every key is chained from one parent, so the keys of all workers form a
// tree, stored path-compressed: a node holds a run of consecutive keys, and
// segments give each stretch of the run its holder set, a sorted immutable
// list of (worker, media bitmask) shared by every key of the stretch. A
// branch is a child node attached at any key of its parent's run; heads, a
// map sharded by key, finds a node by its first key. Match compares a
// prompt's keys with a run, looks at a holder set only where it changes and
// probes heads only where the prompt leaves a node (see Index.Match).
//
// Each Worker maps engine hash to the block's place in the tree and its
// per-medium store counts (vLLM may store a block twice, and each store
// needs its own removal). The tree records only which media a worker holds
// a key in, so that holder sets stay shareable.
//
// # Events that cannot be applied exactly
//
// Nothing is dropped silently. A BlockStored whose parent is unknown is
// indexed under keys derived from the missing parent (its removals and
// descendants still resolve, no prompt can match it) and counted as
// orphans; token counts that do not cover the blocks, removals of blocks
// never stored, removals of KV-cache groups never stored (which touch
// nothing) and stores describing a group anew while it holds blocks are
// counted per worker and returned. Blocks dropped for the capacity or the
// memory budget are counted as evictions.
//
// # KV-cache groups
//
// vLLM keeps one KV-cache group per kind of attention layer and announces
// each group's blocks with its index, kind and block size (groups.go). A
// worker's first group of a kind that keeps the whole context (full, MLA
// or sink attention) is its anchor, whose blocks are its residency in the
// tree; its other groups with a hit rule (sliding window, mamba, further
// full attention) are side groups, kept per (group, content key), which
// cap the hits the scorer credits as vLLM's hybrid coordinator does
// (Worker.Cap); groups of kinds whose rule kvindex does not model are
// counted. A model's block size, the one prompts are keyed at, is learned
// from its workers' events (Model.BlockSize); a worker that announces
// another is flagged (Worker.BlockSizeMismatch), its blocks kept at their
// own size.
//
// A window or mamba group's store names only the positions the group
// keeps while its token_ids cover the whole range (vLLM's null blocks):
// its hashes are the range's last positions; a prefix group's store that
// skips a position is refused.
//
// # Replication
//
// Worker.ApplyBatchDelta records what each batch did to a worker's resident
// set as a Delta of content keys. A keyed worker (WorkerInfo.Keyed) is built
// from a Snapshot by Worker.Restore and then applies the deltas after it
// with Worker.ApplyDelta, holding the same keys in the same media at the
// same places, so Match answers for it as for the source; Worker.Digest
// proves the resident sets equal. An effect that does not fit is counted
// and reported (ErrDeltaMismatch), for the caller to restore anew.
// Worker.Checkpoint saves a worker fed engine events whole, for a restarted
// fleet agent to go on feeding it.
//
// # Concurrency
//
// Index and Worker are safe for concurrent use; Match takes no lock on the
// tree and records no recency. Lock order: see Index.
//
// # Memory
//
// Per (block, worker) residency: the residency index's keys (8 bytes per
// key, shared by its holders) and the engine maps' entries (blockmap,
// pointer-free so the garbage collector does not scan them); measured in
// docs/benchmarks.md (BenchmarkMemory10M). Memory is bounded twice: each
// worker holds at most its capacity (see Worker), which bounds what lost
// removals leave behind, and Config.MemoryBudget bounds the estimated
// total, evicting from the workers that hold the most. No cap limits how
// many workers may hold one block.
package indexer
