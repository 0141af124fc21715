// Package workload is what kvsim replays: a list of requests with arrival
// times, prompts and output lengths, read from Mooncake-format traces or
// generated.
//
// # Generators
//
// Prefixes (shared prefixes of Zipf popularity) and Tenants (tenants'
// contexts and users' questions) are the simple shapes; the workload
// suite adds Sessions (multi-turn agent sessions: Zipf system prompts,
// histories that grow turn by turn, think times), RAG (retrieved
// documents that recur in varying subsets and orders) and ToolAgents
// (agents sharing long tool catalogs, each task a loop of tool calls and
// results). Conversational generators are open loop: a later turn
// arrives when the generator placed it, whatever the simulated fleet did.
//
// # Prompts without text
//
// A prompt is a sequence of Segments. A segment is a run of tokens named by
// a content id: its tokens are Token(id, 0), Token(id, 1), ..., a pure
// function of the id, so two prompts that share a segment id at the same
// position share those tokens exactly, at any engine block size. Mooncake's
// 512-token hash ids become segments of 512 tokens (the last one possibly
// shorter); the generators build prompts from shared segments (a tenant's
// context, a popular prefix) and unique ones (a user's question).
//
// Nothing materialises tokens unless asked: engines identify blocks by
// BlockContent (a hash of each block's segment pieces, which is equal
// exactly when the tokens are), and only the components that need real
// token ids (kvindex's events and Score requests) call AppendTokens.
//
// # Determinism
//
// Loading and generating are deterministic: the same file or the same
// generator parameters and seed give the same requests, token for token.
//
// # Concurrency
//
// A Workload is read-only once built and may be shared by goroutines.
package workload
