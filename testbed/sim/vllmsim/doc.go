// Package vllmsim serves one simulated vLLM engine (package engine, on
// the wall clock) as vLLM serves one: `kvsim engine` in the compose demo
// and wherever a real engine is wanted without a GPU. It offers
//
//   - KV events in vLLM's wire format over ZeroMQ (testbed/enginepub: PUB
//     and replay ROUTER sockets), one batch per engine step;
//   - /metrics under vLLM's names (vllm:num_requests_running,
//     vllm:kv_cache_usage_perc, vllm:prefix_cache_hits_total, ...);
//   - /v1/completions, /v1/chat/completions, /v1/models and /health, each
//     request served by the engine (filling and evicting its cache) and
//     answered with usage.prompt_tokens_details.cached_tokens;
//   - /tokenize and the render endpoints in vLLM's JSON.
//
// Prompts are tokenized by package standin, so the ids the KV events
// carry are those /tokenize answers and standin.Chat computes elsewhere.
//
// One mutex guards the engine, taken by the step loop and by each request
// while it touches the engine.
package vllmsim
