// Package picker is kvindex's endpoint picker for the Gateway API
// Inference Extension (GIE): an Envoy ext_proc v3 ExternalProcessor that a
// gateway (Envoy Gateway, kgateway, Istio, GKE, ...) asks, request by
// request, which model server of an InferencePool should serve an OpenAI
// /v1/completions or /v1/chat/completions call.
//
// For each request (one ext_proc stream) the picker reads the headers and
// body, takes the prompt (text, chat or token ids), and picks with Route
// among the pool's endpoints (an immutable set SetEndpoints replaces). It
// answers as GIE's protocol specifies: "ip:port,ip:port" (chosen, then
// fallbacks) in the x-gateway-destination-endpoint header and the envoy.lb
// metadata. A request without a usable prompt, or whose prompt could not
// be tokenized, is still routed, by load alone.
//
// A Picker serves any number of streams at once; they share only the
// Router, the counters, the endpoint set (an atomic pointer), the body
// buffer pool and the bound on requests followed.
package picker
