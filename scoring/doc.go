// Package scoring turns per-worker prefix matches from the indexer into a
// ranking: which worker should take a request.
//
// The policy today is longest prefix: more consecutive cached blocks from
// the start of the prompt rank first, then more of them on GPU (a CPU block
// must be copied back before use), then the worker's name, so that equal
// answers are stable across calls and replicas. Load-aware policies build
// on the same ordering.
//
// Functions here are pure and safe for concurrent use.
package scoring
