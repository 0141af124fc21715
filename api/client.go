package api

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// Client is a kvindex client for Go routers and tools over a
// grpc.ClientConn. Errors name the call and server and keep their gRPC
// status (status.Code(err); ServerStatus(err) for the server's message).
type Client struct {
	addr string
	conn *grpc.ClientConn
	rpc  kvindexv1.IndexServiceClient
}

// Dial returns a client of the server at addr (any gRPC target): plaintext
// unless opts say otherwise, kvindex's Codec and fixed windows; later options
// override earlier ones. The first call connects.
func Dial(ctx context.Context, addr string, opts ...grpc.DialOption) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("kvindex: dial %s: %w", addr, err)
	}
	all := make([]grpc.DialOption, 0, len(opts)+4)
	all = append(all,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(NewCodec())),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
	)
	all = append(all, opts...)
	conn, err := grpc.NewClient(addr, all...)
	if err != nil {
		return nil, fmt.Errorf("kvindex: dial %s: %w", addr, err)
	}
	return &Client{addr: addr, conn: conn, rpc: kvindexv1.NewIndexServiceClient(conn)}, nil
}

// Score asks for each worker's resident prefix of a prompt.
func (c *Client) Score(ctx context.Context, req *kvindexv1.ScoreRequest, opts ...grpc.CallOption) (*kvindexv1.ScoreResponse, error) {
	resp, err := c.rpc.Score(ctx, req, opts...)
	if err != nil {
		return nil, fmt.Errorf("kvindex: Score at %s (model %q): %w", c.addr, req.GetModel(), err)
	}
	return resp, nil
}

// Route ranks the workers, picks one and records the choice; call Release
// when the request's prefill is done.
func (c *Client) Route(ctx context.Context, req *kvindexv1.RouteRequest, opts ...grpc.CallOption) (*kvindexv1.RouteResponse, error) {
	resp, err := c.rpc.Route(ctx, req, opts...)
	if err != nil {
		return nil, fmt.Errorf("kvindex: Route at %s (request %q): %w", c.addr, req.GetRequestId(), err)
	}
	return resp, nil
}

// Release ends a routed request's in-flight accounting.
func (c *Client) Release(ctx context.Context, requestID string, opts ...grpc.CallOption) (bool, error) {
	resp, err := c.rpc.Release(ctx, &kvindexv1.ReleaseRequest{RequestId: requestID}, opts...)
	if err != nil {
		return false, fmt.Errorf("kvindex: Release at %s (request %q): %w", c.addr, requestID, err)
	}
	return resp.GetReleased(), nil
}

// ListWorkers lists the workers and their counters.
func (c *Client) ListWorkers(ctx context.Context, req *kvindexv1.ListWorkersRequest, opts ...grpc.CallOption) (*kvindexv1.ListWorkersResponse, error) {
	resp, err := c.rpc.ListWorkers(ctx, req, opts...)
	if err != nil {
		return nil, fmt.Errorf("kvindex: ListWorkers at %s: %w", c.addr, err)
	}
	return resp, nil
}

// Lookup asks which workers hold each block of a prompt.
func (c *Client) Lookup(ctx context.Context, req *kvindexv1.LookupRequest, opts ...grpc.CallOption) (*kvindexv1.LookupResponse, error) {
	resp, err := c.rpc.Lookup(ctx, req, opts...)
	if err != nil {
		return nil, fmt.Errorf("kvindex: Lookup at %s (model %q): %w", c.addr, req.GetModel(), err)
	}
	return resp, nil
}

// Dump asks for a page of a worker's resident keys.
func (c *Client) Dump(ctx context.Context, req *kvindexv1.DumpRequest, opts ...grpc.CallOption) (*kvindexv1.DumpResponse, error) {
	resp, err := c.rpc.Dump(ctx, req, opts...)
	if err != nil {
		return nil, fmt.Errorf("kvindex: Dump at %s (worker %s/%d): %w", c.addr, req.GetWorker().GetPod(), req.GetWorker().GetDpRank(), err)
	}
	return resp, nil
}

// Diagnose asks why a worker misses a prompt.
func (c *Client) Diagnose(ctx context.Context, req *kvindexv1.DiagnoseRequest, opts ...grpc.CallOption) (*kvindexv1.DiagnoseResponse, error) {
	resp, err := c.rpc.Diagnose(ctx, req, opts...)
	if err != nil {
		return nil, fmt.Errorf("kvindex: Diagnose at %s (worker %s/%d): %w", c.addr, req.GetWorker().GetPod(), req.GetWorker().GetDpRank(), err)
	}
	return resp, nil
}

// Watch streams the events the index applies; cancel ctx to end it.
func (c *Client) Watch(ctx context.Context, req *kvindexv1.WatchRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[kvindexv1.WatchResponse], error) {
	st, err := c.rpc.Watch(ctx, req, opts...)
	if err != nil {
		return nil, fmt.Errorf("kvindex: Watch at %s: %w", c.addr, err)
	}
	return st, nil
}

// Conn returns the underlying connection, e.g. to query the health service.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection; calls in flight fail.
func (c *Client) Close() error {
	if err := c.conn.Close(); err != nil {
		return fmt.Errorf("kvindex: close connection to %s: %w", c.addr, err)
	}
	return nil
}

// ServerStatus returns the gRPC status inside err with the server's own
// message (status.FromError gives the wrapped text), or false.
func ServerStatus(err error) (*status.Status, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return nil, false
	}
	st := se.GRPCStatus()
	return st, st != nil
}
