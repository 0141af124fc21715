// Package integration holds kvindex's end-to-end tests: simulated vLLM
// engines publish real KV events over ZeroMQ in vLLM's exact wire format,
// a real daemon ingests them, and the tests ask it over real gRPC (and
// HTTP, for metrics) on loopback. Nothing is mocked.
package integration
