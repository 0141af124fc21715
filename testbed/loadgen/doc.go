// Package loadgen drives kvindex's Score RPC at a fixed, open-loop rate and
// reports the latency distribution a router would see. It is the logic
// behind testbed/cmd/kvbench and the gRPC rows of `make bench`, which
// measure kvindex against Canned, a grpc-go server that answers with a
// response computed once: the floor of serving Score over gRPC.
//
// # Open loop
//
// Request k is due at start + k/rate whatever happened to earlier requests,
// and its latency is measured from that due time, not from when it was
// actually sent. A closed-loop client that waits for each reply before
// sending the next one stops sending while the server stalls, and so hides
// the stall from its own statistics ("coordinated omission"); measuring from
// the schedule charges a stall to every request it delayed, as wrk2 does.
// A pacer releases each request at its due time to Config.Concurrency
// sender goroutines, which share the connections in turn (one each by
// default); if all of them are busy, due requests wait and that wait is
// part of their latency. On Linux the pacer waits on a periodic timerfd:
// Go's timers wake an idle process up to 1 ms late, which the open loop
// would otherwise charge to the server.
//
// # Clients
//
// Calls go through kvindex's Go client (api.Client, grpc-go), a Go
// router's view, marshalling every request or sending each distinct one
// pre-encoded (ScoreDo).

package loadgen
