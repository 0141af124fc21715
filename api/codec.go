package api

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// maxPooledTokens bounds pooled token slices (512 KiB) so a huge prompt pins nothing.
const maxPooledTokens = 128 << 10

// Codec is gRPC's protobuf codec (name "proto", the same bytes) with the
// Score call's hot paths by hand: a ScoreRequest's token_ids are decoded into
// a pooled slice and encoded into a pooled buffer by loops for token-sized
// varints; everything else goes through protobuf-go.
//
// Why: protobuf-go takes ~10 ns a packed uint32 to decode (~20 µs for 2,048
// tokens, five times the Score behind it) plus 8 KiB per call, and ~6 ns to
// encode; these loops take ~2 ns and allocate nothing in steady state
// (BenchmarkCodec; docs/benchmarks.md). GRPCOptions installs the interceptor
// that gives the pooled slice back.
type Codec struct {
	fallback encoding.CodecV2
	tokens   sync.Pool // *[]uint32 with len 0
	requests requestPool
	// malformed, only in a server's codec, notes undecodable requests (malformed.go).
	malformed *malformedSet
}

// NewCodec returns a Codec with an empty token pool.
func NewCodec() *Codec {
	return &Codec{fallback: encoding.GetCodecV2(grpcproto.Name)}
}

// newServerCodec returns a server's Codec, which notes undecodable requests.
func newServerCodec() *Codec {
	c := NewCodec()
	c.malformed = &malformedSet{}
	return c
}

// Name returns "proto": peers see gRPC's standard content subtype.
func (c *Codec) Name() string { return grpcproto.Name }

// Marshal encodes v; a *kvindexv1.ScoreRequest by hand into a pooled buffer,
// the same bytes as protobuf-go (FuzzMarshalScoreRequest).
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	if req, ok := v.(*kvindexv1.ScoreRequest); ok && req != nil {
		if data, ok, err := marshalScoreRequest(req, &c.requests); ok {
			return data, err
		}
	}
	return c.fallback.Marshal(v)
}

// Unmarshal decodes data into v; a *kvindexv1.ScoreRequest (into pooled
// tokens) and a ScoreResponse in the server's form by hand.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *kvindexv1.ScoreRequest:
		if m.TokenIds == nil {
			if p, _ := c.tokens.Get().(*[]uint32); p != nil {
				m.TokenIds = *p
			}
		}
		return c.withBytes(data, func(b []byte) error { return c.noted(m, b, UnmarshalScoreRequest(b, m)) })
	case *kvindexv1.ScoreResponse:
		return c.withBytes(data, func(b []byte) error {
			if unmarshalScoreResponse(b, m) {
				return nil
			}
			return proto.Unmarshal(b, m)
		})
	}
	err := c.fallback.Unmarshal(data, v)
	if m, ok := v.(proto.Message); ok && err != nil && c.malformed != nil {
		return c.withBytes(data, func(b []byte) error { return c.noted(m, b, err) })
	}
	return err
}

// noted returns err, or in a server's codec notes m's status and returns nil.
func (c *Codec) noted(m proto.Message, b []byte, err error) error {
	if err == nil || c.malformed == nil {
		return err
	}
	c.malformed.add(m, malformedStatus(m, b, err))
	return nil
}

// withBytes calls f with data's bytes, gathered into a pooled buffer when
// split (f must not keep them).
func (c *Codec) withBytes(data mem.BufferSlice, f func([]byte) error) error {
	if len(data) == 1 {
		return f(data[0].ReadOnlyData())
	}
	buf := data.MaterializeToBuffer(&c.requests)
	defer buf.Free()
	return f(buf.ReadOnlyData())
}

// release gives req's token slice back to the pool (a pointer to req's
// field: no allocation); req must not be used after.
func (c *Codec) release(req *kvindexv1.ScoreRequest) {
	if cap(req.TokenIds) == 0 || cap(req.TokenIds) > maxPooledTokens {
		return
	}
	req.TokenIds = req.TokenIds[:0]
	c.tokens.Put(&req.TokenIds)
}

// releaseInterceptor refuses a request the codec noted as malformed, and
// gives each Score's pooled tokens back once answered (Server keeps neither).
func (c *Codec) releaseInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := c.malformed.take(req); err != nil {
		if r, ok := req.(*kvindexv1.ScoreRequest); ok {
			c.release(r)
		}
		return nil, err
	}
	resp, err := handler(ctx, req)
	if r, ok := req.(*kvindexv1.ScoreRequest); ok {
		c.release(r)
	}
	return resp, err
}

// streamInterceptor makes RecvMsg return a malformed message's status.
func (c *Codec) streamInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &checkedStream{ServerStream: ss, set: c.malformed})
}

// checkedStream is a grpc.ServerStream whose RecvMsg reports malformed messages.
type checkedStream struct {
	grpc.ServerStream
	set *malformedSet
}

// RecvMsg receives m, failing with InvalidArgument when m was malformed.
func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.set.take(m)
}
