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

// maxPooledTokens bounds the token slices the codec keeps for reuse
// (512 KiB each), so that one huge prompt does not pin its memory.
const maxPooledTokens = 128 << 10

// Codec is kvindex's gRPC codec: gRPC's protobuf codec (name "proto", the
// same bytes on the wire) with the Score call's hot paths written by hand.
// A ScoreRequest's token_ids, thousands of varints per call, are decoded by
// a loop specialised for token-sized varints into a pooled slice, and
// encoded by a loop of the same kind into a pooled buffer; every other
// field and message goes through protobuf-go as usual.
//
// Why: protobuf-go decodes packed uint32s at ~10 ns each, ~20 µs for a
// 2,048-token prompt, five times the whole Score behind it, plus an 8 KiB
// allocation per call, and encodes them at ~6 ns each (docs/benchmarks.md,
// gRPC rows). The loops here take ~2 ns per token to decode (3.7 µs for
// 2,048) and less to encode, and allocate nothing in steady state
// (BenchmarkCodec).
//
// A server gives the pooled slice back when the call ends: Server's
// GRPCOptions installs the codec together with the interceptor that does.
type Codec struct {
	fallback encoding.CodecV2
	tokens   sync.Pool // *[]uint32 with len 0
	requests requestPool
	// malformed, set only in a server's codec (NewServer), notes the
	// requests that fail to decode instead of failing them (malformed.go).
	malformed *malformedSet
}

// NewCodec returns a Codec with an empty token pool.
func NewCodec() *Codec {
	return &Codec{fallback: encoding.GetCodecV2(grpcproto.Name)}
}

// newServerCodec returns a server's Codec: one that notes the requests
// it cannot decode for the interceptors to refuse (malformed.go).
func newServerCodec() *Codec {
	c := NewCodec()
	c.malformed = &malformedSet{}
	return c
}

// Name returns "proto": peers see gRPC's standard content subtype.
func (c *Codec) Name() string { return grpcproto.Name }

// Marshal encodes v. A *kvindexv1.ScoreRequest takes the hand path
// (appendScoreRequest, into a buffer from gRPC's pool, which gRPC gives
// back once the bytes are written); anything else goes to gRPC's protobuf
// codec. Both produce the same bytes (TestMarshalScoreRequest,
// FuzzMarshalScoreRequest).
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	if req, ok := v.(*kvindexv1.ScoreRequest); ok && req != nil {
		if data, ok, err := marshalScoreRequest(req, &c.requests); ok {
			return data, err
		}
	}
	return c.fallback.Marshal(v)
}

// Unmarshal decodes data into v. A *kvindexv1.ScoreRequest takes the hand
// path (UnmarshalScoreRequest, into pooled token memory), and so does a
// *kvindexv1.ScoreResponse in the form kvindex's server writes
// (unmarshalScoreResponse); anything else goes to gRPC's protobuf codec.
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

// noted returns err, or, in a server's codec, notes m as malformed (with
// the InvalidArgument status naming the field of its encoding b) and
// returns nil; the interceptors answer with that status.
func (c *Codec) noted(m proto.Message, b []byte, err error) error {
	if err == nil || c.malformed == nil {
		return err
	}
	c.malformed.add(m, malformedStatus(m, b, err))
	return nil
}

// withBytes calls f with data's bytes, gathered into one buffer of the
// codec's request pool when they are in several (f must not keep them).
func (c *Codec) withBytes(data mem.BufferSlice, f func([]byte) error) error {
	if len(data) == 1 {
		return f(data[0].ReadOnlyData())
	}
	buf := data.MaterializeToBuffer(&c.requests)
	defer buf.Free()
	return f(buf.ReadOnlyData())
}

// release gives req's token slice back to the pool; req must not be used
// after. The pool keeps a pointer to req's field (req itself, a few dozen
// bytes, stays alive with it), so release allocates nothing.
func (c *Codec) release(req *kvindexv1.ScoreRequest) {
	if cap(req.TokenIds) == 0 || cap(req.TokenIds) > maxPooledTokens {
		return
	}
	req.TokenIds = req.TokenIds[:0]
	c.tokens.Put(&req.TokenIds)
}

// releaseInterceptor answers a request the codec could not decode with
// its InvalidArgument status before any handler sees it, and gives each
// Score's pooled token slice back once the handler has answered. It relies
// on the handler not keeping the request or its token ids, which holds for
// Server.
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

// streamInterceptor gives a streaming handler the InvalidArgument status
// of a message the codec could not decode, from RecvMsg, instead of the
// message.
func (c *Codec) streamInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &checkedStream{ServerStream: ss, set: c.malformed})
}

// checkedStream is a grpc.ServerStream whose RecvMsg reports messages the
// codec noted as malformed.
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
