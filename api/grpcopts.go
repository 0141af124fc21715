package api

import (
	"runtime"

	"google.golang.org/grpc"
)

// Flow-control windows of GRPCOptions and DialOptions: large enough that
// a connection carrying thousands of Scores a second never waits for a
// WINDOW_UPDATE, and fixed, which turns off gRPC's bandwidth-delay probing
// (a PING round trip per burst).
const (
	streamWindow = 1 << 20
	connWindow   = 16 << 20
)

// streamWorkers is the size of GRPCOptions' stream worker pool: 4 per
// core, at least 8. A worker is taken from a call's HEADERS frame until its
// handler returns, which includes waiting for the DATA frame behind them,
// so one worker per core does not keep calls off new goroutines: with one
// worker at GOMAXPROCS 1 and 10 k req/s, a third of the calls find it taken
// and grpc-go runs them on a goroutine of their own (docs/benchmarks.md,
// gRPC rows). An idle worker costs a parked goroutine.
func streamWorkers() uint32 {
	return uint32(max(4*runtime.GOMAXPROCS(0), 8))
}

// GRPCOptions returns the options a grpc.Server serving s should be built
// with (the daemon and kvbench use them):
//
//   - Codec, which decodes a ScoreRequest's token ids by hand into pooled
//     memory, with an interceptor that takes the memory back when each
//     Score returns;
//   - a fixed pool of stream workers (streamWorkers), so that calls run
//     on goroutines whose stacks have already grown instead of a new
//     goroutine each;
//   - fixed, large flow-control windows.
//
// BenchmarkScoreGRPC measures them; docs/benchmarks.md has the numbers.
func (s *Server) GRPCOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(s.codec),
		grpc.ChainUnaryInterceptor(s.codec.releaseInterceptor),
		grpc.NumStreamWorkers(streamWorkers()),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
	}
}
