// Package tokenize turns text prompts into the token ids an engine will
// see, by asking the model's own vLLM server: its render endpoints
// (/v1/chat/completions/render, /v1/completions/render) or, on a server
// without them, /tokenize render a chat with the chat template the engine
// uses and tokenize with the engine's tokenizer, so the ids match the
// engine's KV blocks exactly. Which of the two a server has is remembered
// per server (a 404 that is not vLLM's error object means no render
// endpoint) and asked again after Options.RenderRetry. A router-side tokenizer or template that differs by one token
// silently zeroes the cache hit rate; asking the engine cannot differ.
//
// A Client holds, per model, the base URLs of servers that tokenize for
// it, a bounded LRU cache of answers (hashicorp/golang-lru/v2) keyed by
// the request's content, and single-flight: identical prompts asked at
// once cost one round trip. Every bound (cache entries, concurrent round
// trips, prompt bytes, answer tokens, time) is an Option, and every
// refusal is counted.
//
// The wire format is vLLM's: one body for both (WireRequest: model with
// prompt and add_special_tokens, or messages with add_generation_prompt);
// /tokenize answers WireResponse (tokens, count, max_model_len), a render
// endpoint the generation request the prompt would become (WireRender's
// token_ids; a list of one for a completion). Package standin serves both
// with a deterministic stand-in tokenizer for tests and simulated
// engines.
//
// # Concurrency
//
// A Client is safe for concurrent use. Tokenize's result is shared with
// the cache and with concurrent callers: callers must not modify it.
package tokenize
