package api

import (
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
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
//   - fixed, large flow-control windows;
//   - bounds: the largest message the limits allow (MaxRecvMsgSize), the
//     calls one connection may run at once (MaxConcurrentStreams),
//     keepalive enforcement, and admission control of Score and Route
//     (AdmissionOptions).
//
// BenchmarkScoreGRPC measures them; docs/benchmarks.md has the numbers.
func (s *Server) GRPCOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(s.codec),
		grpc.ChainUnaryInterceptor(s.codec.releaseInterceptor),
		grpc.ChainStreamInterceptor(s.codec.streamInterceptor),
		grpc.NumStreamWorkers(streamWorkers()),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.MaxRecvMsgSize(s.MaxRecvMsgSize()),
		grpc.MaxConcurrentStreams(s.maxStreams()),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: s.keepaliveMin(), PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Minute, Timeout: 20 * time.Second}),
	}
	if s.admission != nil {
		opts = append(opts, s.admission.options()...)
	}
	return opts
}

// MaxRecvMsgSize is the largest request the server reads: the largest
// ScoreRequest the limits allow (token ids are varints of at most 5 bytes,
// block keys of at most 10) plus 1 MiB for candidates, loads and extra
// keys. A larger message is refused by gRPC (ResourceExhausted) before it
// is buffered whole.
func (s *Server) MaxRecvMsgSize() int {
	return 5*s.opts.MaxTokens + 10*s.opts.MaxBlockKeys + 1<<20
}

func (s *Server) maxStreams() uint32 {
	if s.opts.MaxConcurrentStreams > 0 {
		return s.opts.MaxConcurrentStreams
	}
	return 256
}

func (s *Server) keepaliveMin() time.Duration {
	if s.opts.KeepaliveMinTime > 0 {
		return s.opts.KeepaliveMinTime
	}
	return 10 * time.Second
}
