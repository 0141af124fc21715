// Package workload is what kvsim replays: requests with arrival times,
// prompts and output lengths, read from Mooncake-format traces and
// request logs or generated (Prefixes, Tenants, and the suite: Sessions,
// RAG, ToolAgents). Conversational generators are open loop: a turn
// arrives when the generator placed it, whatever the fleet did.
//
// A prompt is a sequence of Segments, runs of tokens named by a content
// id (token i is Token(id, i)), so prompts sharing a segment at the same
// position share its tokens at any block size. Engines identify blocks by
// AppendBlockContent, a hash of each block's pieces; only kvindex's
// events and queries materialise tokens (AppendTokens).
//
// Loading and generating are deterministic for a file or a seed. A
// Workload is read-only once built and may be shared by goroutines.
package workload
