// Package gie is kvindex's scorer plugin for the scheduling framework of
// the Gateway API Inference Extension's endpoint picker (EPP), the
// framework llm-d's router grew from: a Scorer, of type
// "kvindex-prefix-scorer", that scores each candidate endpoint with the
// fraction of the request's prompt its engine already holds in KV cache,
// as kvindex's gRPC Score answers it.
//
// It lives in a module of its own (clients/gie) so that the service's
// go.mod does not carry the framework's dependencies. It builds against
// sigs.k8s.io/gateway-api-inference-extension v1.5.0, the last release
// that ships the EPP (pkg/epp); later releases moved it to llm-d's router.
//
// # Using it
//
// Register adds the plugin's factory to the framework's registry; call it
// in the EPP's main before the runner loads its configuration, then name
// the type in an EndpointPickerConfig with its parameters (Params, as
// JSON: the kvindex target, the model, a timeout, optional TLS and
// token). Weight it against the framework's load scorers as for any
// scorer; the max-score picker then prefers the endpoint holding the
// longest prefix.
//
// # What it asks
//
// Per scheduling cycle, one Score call over one gRPC connection (made
// once, reused, closed when the EPP's context ends), under a deadline of
// Params.Timeout. The prompt is, in order of preference: the request's
// token ids (LLMRequest.TokenizedPrompt, the engine's own), its chat
// messages (the text parts of each message's content, joined by
// newlines, as kvindex's ChatMessage wants), or its completion prompt
// (the first prompt of a batch); kvindex tokenizes text through the
// model's vLLM server. The request's cache_salt is passed on. Requests
// of other APIs (responses, conversations, embeddings) score 0.
//
// An endpoint is a kvindex worker, found in this order: by its ip:port
// in Params.Endpoints (the same address-to-worker table kvindex's own
// endpoint picker is configured with), else by its pod name and rank, as
// the EPP names them when it reads an InferencePool: endpoint
// "<pod>-rank-<i>" is worker (pod, dp_rank i), target port i serving rank
// i; this is how kvindex's Kubernetes discovery and its InferencePool
// watch name workers too. An endpoint with neither scores 0, counted.
//
// # Scores
//
// An endpoint's score is its worker's overlap in kvindex's answer: the
// tier-weighted fraction of the prompt's full blocks it holds as a
// prefix, 0..1 (GPU blocks weigh 1). Load is left to the framework's
// other scorers.
//
// When kvindex cannot answer (unreachable, past the deadline, refusing
// the request) every endpoint scores 0, which leaves the ranking to the
// other scorers (any constant would), and the failure is counted in
// kvindex_gie_scores_total{outcome="failed"} and logged when it starts
// and when kvindex answers again. Nothing panics on bad input: a request
// without a usable prompt scores 0 and is counted as outcome "no_prompt".
//
// # Concurrency
//
// A Scorer is safe for concurrent use; calls share only the connection
// and the counters.
package gie
