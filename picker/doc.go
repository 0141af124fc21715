// Package picker is kvindex's endpoint picker for the Gateway API
// Inference Extension (GIE): an Envoy ext_proc v3 ExternalProcessor that a
// gateway (Envoy Gateway, kgateway, Istio, GKE, ...) asks, request by
// request, which model server of an InferencePool should serve an OpenAI
// /v1/completions or /v1/chat/completions call.
//
// For each request (one ext_proc stream) the picker reads the headers and
// the body (whole, or in chunks, per the filter's body mode), takes the
// prompt from the body (text, a chat, or token ids), and picks with
// kvindex's Route among the pool's endpoints (a subset hint narrows
// them, stale workers are left out). The endpoints are one immutable set
// that SetEndpoints replaces while the picker serves (the daemon's, from
// an InferencePool or discovery): a decision reads the set once. It answers the way GIE's
// endpoint-picker protocol specifies: the chosen endpoint and the
// fallbacks after it, "ip:port,ip:port", in the x-gateway-destination-endpoint
// header and under the same key in the envoy.lb dynamic metadata; the body
// goes on unchanged. It then watches the response: the first response body
// chunk ends the request's prefill, so it is released (Release); an error
// status, the end of the response, or the stream closing first (the client
// went away, the upstream failed) releases it too. Each release is counted
// by reason, and no stream ends with its request still in flight.
//
// A request the picker cannot read a prompt from (not JSON, no prompt, a
// GET) and one whose prompt could not be tokenized is still routed, by
// load alone. No ready endpoint is answered 503, overload 429, a body
// over the limit 413, as the protocol asks.
//
// # Concurrency
//
// A Picker serves any number of streams at once, each on its own
// goroutine (gRPC's); streams share nothing but the Router, the counters,
// the endpoint set (an atomic pointer), the pool of body buffers and the
// bound on requests followed at once.
package picker
