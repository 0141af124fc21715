package api

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// maxPooledTokens bounds the token slices the codec keeps for reuse
// (512 KiB each), so that one huge prompt does not pin its memory.
const maxPooledTokens = 128 << 10

// scoreTokensField is ScoreRequest.token_ids's field number.
const scoreTokensField protowire.Number = 2

// Codec is kvindex's gRPC codec: gRPC's protobuf codec (name "proto", the
// same bytes on the wire) with one hot path written by hand. A
// ScoreRequest's token_ids, thousands of varints per call, are decoded by
// a loop specialised for token-sized varints into a pooled slice; every
// other field and message goes through protobuf-go as usual.
//
// Why: protobuf-go decodes packed uint32s at ~10 ns each, ~20 µs for a
// 2,048-token prompt, five times the whole Score behind it, plus an 8 KiB
// allocation per call (docs/benchmarks.md, gRPC row). The loop here takes
// ~2 ns per token (3.7 µs for 2,048) and allocates nothing in steady state (BenchmarkCodec).
//
// A server gives the pooled slice back when the call ends: Server's
// GRPCOptions installs the codec together with the interceptor that does.
type Codec struct {
	fallback encoding.CodecV2
	tokens   sync.Pool // *[]uint32 with len 0
}

// NewCodec returns a Codec with an empty token pool.
func NewCodec() *Codec {
	return &Codec{fallback: encoding.GetCodecV2(grpcproto.Name)}
}

// Name returns "proto": peers see gRPC's standard content subtype.
func (c *Codec) Name() string { return grpcproto.Name }

// Marshal encodes v with gRPC's protobuf codec.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	return c.fallback.Marshal(v)
}

// Unmarshal decodes data into v. A *kvindexv1.ScoreRequest takes the hand
// path (UnmarshalScoreRequest, into pooled token memory); anything else
// goes to gRPC's protobuf codec.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*kvindexv1.ScoreRequest)
	if !ok {
		return c.fallback.Unmarshal(data, v)
	}
	if req.TokenIds == nil {
		if p, _ := c.tokens.Get().(*[]uint32); p != nil {
			req.TokenIds = *p
		}
	}
	var err error
	if len(data) == 1 {
		err = UnmarshalScoreRequest(data[0].ReadOnlyData(), req)
	} else {
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		err = UnmarshalScoreRequest(buf.ReadOnlyData(), req)
		buf.Free()
	}
	return err
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

// releaseInterceptor gives each Score's pooled token slice back once the
// handler has answered. It relies on the handler not keeping the request
// or its token ids, which holds for Server.
func (c *Codec) releaseInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if r, ok := req.(*kvindexv1.ScoreRequest); ok {
		c.release(r)
	}
	return resp, err
}

// UnmarshalScoreRequest decodes a protobuf-encoded ScoreRequest into req,
// merging as proto.UnmarshalOptions{Merge: true} does: token ids are
// appended to req.TokenIds (whose capacity is reused). It accepts and
// rejects what protobuf-go does and produces the same message
// (FuzzUnmarshalScoreRequest checks both).
//
// Cost: ~2 ns per token id for the ids, which are all but the whole
// message; the other fields are decoded in place by protobuf-go.
func UnmarshalScoreRequest(b []byte, req *kvindexv1.ScoreRequest) error {
	// other is where the current run of non-token fields began: each run
	// goes to protobuf-go in one call, in order (a prompt's request has
	// one or two runs: the fields before and after the token ids).
	other := 0
	for pos := 0; pos < len(b); {
		num, typ, n := protowire.ConsumeTag(b[pos:])
		if n < 0 {
			return fmt.Errorf("api: unmarshal ScoreRequest: %w", protowire.ParseError(n))
		}
		if num == scoreTokensField && (typ == protowire.BytesType || typ == protowire.VarintType) {
			if err := mergeScoreFields(b[other:pos], req); err != nil {
				return err
			}
			var m int
			if typ == protowire.BytesType { // packed, as every encoder sends it
				var v []byte
				if v, m = protowire.ConsumeBytes(b[pos+n:]); m >= 0 {
					var err error
					if req.TokenIds, err = appendTokenVarints(req.TokenIds, v); err != nil {
						return fmt.Errorf("api: unmarshal ScoreRequest: token_ids: %w", err)
					}
				}
			} else { // unpacked, which parsers must accept too
				var v uint64
				if v, m = protowire.ConsumeVarint(b[pos+n:]); m >= 0 {
					req.TokenIds = append(req.TokenIds, uint32(v))
				}
			}
			if m < 0 {
				return fmt.Errorf("api: unmarshal ScoreRequest: token_ids: %w", protowire.ParseError(m))
			}
			pos += n + m
			other = pos
			continue
		}
		// Any other field, or token_ids with an invalid wire type, which
		// protobuf-go then rejects.
		m := protowire.ConsumeFieldValue(num, typ, b[pos+n:])
		if m < 0 {
			return fmt.Errorf("api: unmarshal ScoreRequest: field %d: %w", num, protowire.ParseError(m))
		}
		pos += n + m
	}
	return mergeScoreFields(b[other:], req)
}

// mergeScoreFields decodes a run of ScoreRequest fields other than
// token_ids into req with protobuf-go.
func mergeScoreFields(b []byte, req *kvindexv1.ScoreRequest) error {
	if len(b) == 0 {
		return nil
	}
	if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(b, req); err != nil {
		return fmt.Errorf("api: unmarshal ScoreRequest: %w", err)
	}
	return nil
}

// appendTokenVarints appends the packed varints in b to dst, truncated to
// 32 bits as protobuf does for uint32. Token ids of vocabularies up to
// 2 M take 1 to 3 bytes: those are decoded inline, longer ones by
// protowire. (A branch-free decode of the length from one 4-byte load
// measured 2x slower: it chains each id's position on the previous load,
// where predicted branches let the CPU run ahead.)
//
// Cost: ~2 ns per id. dst is grown, when needed, to room for len(b) ids
// (b holds at most that many), so there is no allocation when the server's
// pooled slice is reused and at most one otherwise.
func appendTokenVarints(dst []uint32, b []byte) ([]uint32, error) {
	n := len(dst)
	dst = slices.Grow(dst, len(b))
	out := dst[n : n+len(b)]
	k := 0
	for i := 0; i < len(b); k++ {
		b0 := uint32(b[i])
		if b0 < 0x80 {
			out[k] = b0
			i++
			continue
		}
		if i+2 < len(b) {
			b1 := uint32(b[i+1])
			if b1 < 0x80 {
				out[k] = b0&0x7f | b1<<7
				i += 2
				continue
			}
			if b2 := uint32(b[i+2]); b2 < 0x80 {
				out[k] = b0&0x7f | (b1&0x7f)<<7 | b2<<14
				i += 3
				continue
			}
		}
		v, m := protowire.ConsumeVarint(b[i:])
		if m < 0 {
			return dst[:n+k], protowire.ParseError(m)
		}
		out[k] = uint32(v)
		i += m
	}
	return dst[:n+k], nil
}
