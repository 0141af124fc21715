// Package loadgen drives kvindex's Score RPC at a fixed, open-loop rate and
// reports the latency distribution a router would see. It is the logic
// behind testbed/cmd/kvbench and the gRPC rows of `make bench`, which
// measure kvindex against Canned, a grpc-go server that answers with a
// response computed once: the floor of serving Score over gRPC.
//
// Request k is due at start + k/rate whatever happened to earlier
// requests, and its latency is measured from that due time, not from when
// it was sent: a closed-loop client stops sending while the server
// stalls, and so hides the stall ("coordinated omission"), as wrk2
// avoids. A pacer releases each request at its due time to
// Config.Concurrency sender goroutines, which share the connections in
// turn; if all of them are busy, due requests wait and that wait is part
// of their latency. Calls go through kvindex's Go client (api.Client), a
// Go router's view.
package loadgen
