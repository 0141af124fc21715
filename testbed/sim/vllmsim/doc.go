// Package vllmsim is one simulated vLLM engine served as vLLM serves one:
// `kvsim engine` in the docker-compose demo and wherever a real engine is
// wanted without a GPU.
//
// The engine is testbed/sim/engine (continuous batching, a block pool
// with prefix caching and LRU eviction, the step time model) run on the
// wall clock. Around it, the three faces of a vLLM server that kvindex
// and its users meet:
//
//   - KV events in vLLM's wire format over ZeroMQ (testbed/enginepub: a
//     PUB socket and a ROUTER replay socket, as --kv-events-config sets
//     up), one batch per engine step;
//   - /metrics under vLLM's metric names (vllm:num_requests_running,
//     vllm:num_requests_waiting, vllm:kv_cache_usage_perc,
//     vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total, ...),
//     which kvindex scrapes for load and the dashboard plots;
//   - an OpenAI-compatible API (/v1/completions, /v1/chat/completions,
//     /v1/models, /health): each request is tokenized, served by the
//     engine, which fills and evicts its cache (and so publishes events),
//     and answered once its last token is generated, with
//     usage.prompt_tokens_details.cached_tokens saying what it hit;
//   - vLLM's tokenizing endpoints (/tokenize, /v1/chat/completions/render,
//     /v1/completions/render) in vLLM's JSON, which kvindex's tokenizer
//     client asks.
//
// The tokenizer is package standin's, kvindex's one stand-in for vLLM's:
// the engine holds a prompt as standin's segments (Pieces for a
// completion, BOS first; ChatPieces for a chat, generation prompt
// included unless add_generation_prompt is false), so the ids its KV
// events carry are exactly those its /tokenize and render endpoints
// answer, and those the load driver and the tests compute with
// standin.Tokens and standin.Chat. Equal leading pieces give equal
// leading tokens, which is what prefix caching needs.
//
// # Concurrency
//
// A Server's engine is guarded by one mutex, taken by the step loop and by
// each HTTP request for as long as it touches the engine; the HTTP
// handlers run concurrently otherwise.
package vllmsim
