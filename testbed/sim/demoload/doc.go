// Package demoload is the docker-compose demo's load driver (`kvsim
// load`): chat requests that share a few long system prompts, routed by
// kvindex and sent to OpenAI-compatible engines, as a cache-aware router
// in front of vLLM would send them.
//
// For each request it picks a system prompt (Zipf-skewed popularity, so a
// few prefixes are hot), tokenizes the chat with standin.Chat (the
// stand-in tokenizer the simulated engines serve and hold prompts with,
// so the ids it sends kvindex are the ones their events carry), asks kvindex's Route for a worker, posts the chat
// to that worker's engine, and releases the route when the answer
// arrives. When kvindex cannot answer (no workers yet, refused, down) it
// falls back to round-robin and counts it, so the demo's dashboard shows
// both. Arrivals are open-loop (Poisson at Rate), bounded by Concurrency
// requests in flight; a request due while all are busy is counted as
// dropped, not queued.
//
// # Concurrency
//
// Run owns everything it starts; Stats may be read from any goroutine.
package demoload
