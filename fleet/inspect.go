package fleet

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// ServeIndex serves the agent's index over gRPC at addr for inspection
// (agent.grpc_listen): ListWorkers, Lookup, Dump, Diagnose, Watch and
// Score answer from the agent's own workers, so that kvindexctl diff can
// compare a replica with the agent it follows; Route and Release are
// refused PermissionDenied (routing is kvindex serve's). Plaintext:
// callers bind it to the pod's loopback. opts are added to the server's
// own (the interceptors of the process's authentication, so that the
// agent takes the same tokens as kvindex serve). It returns the address
// served and the function that stops serving.
func (a *Agent) ServeIndex(addr string, opts ...grpc.ServerOption) (string, func(), error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("agent: gRPC listen on %s: %w", addr, err)
	}
	srv := api.NewServer(a.ix, a.sub, api.Options{})
	readOnly := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		switch info.FullMethod {
		case kvindexv1.IndexService_Route_FullMethodName, kvindexv1.IndexService_Release_FullMethodName:
			return nil, status.Errorf(codes.PermissionDenied, "%s: an agent's index is served for inspection only; route through kvindex serve", info.FullMethod)
		}
		return h(ctx, req)
	})
	g := grpc.NewServer(append(append(srv.GRPCOptions(), opts...), readOnly)...)
	srv.Register(g)
	go func() { _ = g.Serve(lis) }()
	a.log.Info("kvindex agent index served for inspection", "addr", lis.Addr().String())
	return lis.Addr().String(), g.Stop, nil
}
