// Package tokenize turns text prompts into the token ids an engine will
// see, by asking the model's own vLLM server (its render endpoints, or
// /tokenize on older servers), so the ids match the engine's KV blocks
// exactly: a router-side tokenizer that differs by one token silently
// zeroes the hit rate. Whether a server has render endpoints is
// remembered per server and asked again after Options.RenderRetry.
//
// A Client holds, per model, the servers' base URLs, a bounded LRU cache
// keyed by the request's content, and single-flight. Every bound is an
// Option and every refusal is counted. Package standin serves the same
// wire format with a deterministic stand-in tokenizer for tests. A Client
// is safe for concurrent use.
package tokenize
