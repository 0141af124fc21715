// Package demoload is the compose demo's load driver (`kvsim load`): chat
// requests sharing a few long system prompts (Zipf popularity), tokenized
// with standin.Chat (the ids the simulated engines' events carry), routed
// by kvindex's Route, posted to the chosen engine and released when
// answered. Without a kvindex answer it falls back to round-robin and
// counts it. Arrivals are open loop (Poisson); a request due while the
// concurrency bound is reached is dropped and counted, not queued.
//
// Run owns what it starts; Stats may be read from any goroutine.
package demoload
