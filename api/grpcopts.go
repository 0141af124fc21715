package api

import (
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Flow-control windows of servers and clients: large enough that thousands
// of Scores a second never wait for a WINDOW_UPDATE, and fixed, which turns
// off gRPC's bandwidth-delay probing (a PING round trip per burst).
const (
	streamWindow = 1 << 20
	connWindow   = 16 << 20
)

// streamWorkers sizes GRPCOptions' stream worker pool: 4 per core, at least
// 8. A worker is held from a call's HEADERS until its handler returns (DATA
// wait included), so one per core leaves calls on new goroutines
// (docs/benchmarks.md, gRPC rows); an idle one is a parked goroutine.
func streamWorkers() uint32 {
	return uint32(max(4*runtime.GOMAXPROCS(0), 8))
}

// GRPCOptions returns the options a grpc.Server serving s should be built
// with: Codec and the interceptor that returns its pooled memory, a fixed
// stream worker pool (grown stacks), fixed windows, and the bounds
// (MaxRecvMsgSize, MaxConcurrentStreams, keepalive enforcement, admission).
func (s *Server) GRPCOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(s.codec),
		grpc.ChainUnaryInterceptor(s.codec.releaseInterceptor),
		grpc.ChainStreamInterceptor(s.codec.streamInterceptor),
		grpc.NumStreamWorkers(streamWorkers()),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.MaxRecvMsgSize(s.MaxRecvMsgSize()),
		grpc.MaxConcurrentStreams(s.opts.MaxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: s.opts.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Minute, Timeout: 20 * time.Second}),
	}
	if s.admission != nil {
		opts = append(opts, s.admission.options()...)
	}
	return opts
}

// MaxRecvMsgSize is the largest request the server reads: the largest
// ScoreRequest the limits allow (5 bytes a token id, 10 a block key) plus
// 1 MiB; gRPC refuses a larger one before buffering it.
func (s *Server) MaxRecvMsgSize() int {
	return 5*s.opts.MaxTokens + 10*s.opts.MaxBlockKeys + 1<<20
}
