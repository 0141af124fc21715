package api

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

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

// maxVarint32 is the longest varint of a uint32.
const maxVarint32 = 5

// scoreTokensField is ScoreRequest.token_ids's field number.
const scoreTokensField protowire.Number = 2

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
		if data, ok, err := marshalScoreRequest(req); ok {
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
		return withBytes(data, func(b []byte) error { return c.noted(m, b, UnmarshalScoreRequest(b, m)) })
	case *kvindexv1.ScoreResponse:
		return withBytes(data, func(b []byte) error {
			if unmarshalScoreResponse(b, m) {
				return nil
			}
			return proto.Unmarshal(b, m)
		})
	}
	err := c.fallback.Unmarshal(data, v)
	if m, ok := v.(proto.Message); ok && err != nil && c.malformed != nil {
		return withBytes(data, func(b []byte) error { return c.noted(m, b, err) })
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

// withBytes calls f with data's bytes, gathered into one pooled buffer
// when they are in several (f must not keep them).
func withBytes(data mem.BufferSlice, f func([]byte) error) error {
	if len(data) == 1 {
		return f(data[0].ReadOnlyData())
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
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

// marshalScoreRequest encodes req as protobuf-go would, into a buffer from
// gRPC's pool when it is large enough to be worth pooling (gRPC's own
// threshold, as its protobuf codec does). ok is false when protobuf-go
// must do it instead: a string field that is not valid UTF-8, which
// protobuf-go rejects with its own error.
func marshalScoreRequest(req *kvindexv1.ScoreRequest) (data mem.BufferSlice, ok bool, err error) {
	if !utf8.ValidString(req.GetModel()) || !utf8.ValidString(req.GetLoraName()) || !utf8.ValidString(req.GetCacheSalt()) || !utf8.ValidString(req.GetPrompt()) || !utf8.ValidString(req.GetTenant()) {
		return nil, false, nil
	}
	size := scoreRequestMaxSize(req)
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := appendScoreRequest(make([]byte, 0, size), req)
		if err != nil {
			return nil, true, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, true, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	b, err := appendScoreRequest((*buf)[:0], req)
	if err != nil {
		pool.Put(buf)
		return nil, true, err
	}
	*buf = b // the same memory unless a sub-message grew while it was sent
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, true, nil
}

// ScoreRequest's field numbers other than token_ids, in the order
// protobuf-go writes them (by number, unknown fields last).
const (
	scoreModelField     protowire.Number = 1
	scoreKeysField      protowire.Number = 3
	scoreLoraField      protowire.Number = 4
	scoreSaltField      protowire.Number = 5
	scoreWorkersField   protowire.Number = 6
	scoreExtraKeysField protowire.Number = 7
	scoreLoadsField     protowire.Number = 8
	scorePolicyField    protowire.Number = 9
	scoreExplainField   protowire.Number = 10
	scorePromptField    protowire.Number = 11
	scoreMessagesField  protowire.Number = 12
	scoreTenantField    protowire.Number = 13
)

// scoreRequestMaxSize bounds the encoded size of req: exact but for the
// token ids, counted at their largest (5 bytes each) so that their exact
// size need not be computed in a pass of its own (appendScoreRequest
// learns it by writing them). Sub-messages are sized by protobuf-go.
func scoreRequestMaxSize(req *kvindexv1.ScoreRequest) int {
	n := sizeString(scoreModelField, req.GetModel())
	if ids := req.GetTokenIds(); len(ids) > 0 {
		n += sizeBytesField(scoreTokensField, maxVarint32*len(ids))
	}
	if keys := req.GetBlockKeys(); len(keys) > 0 {
		m := 0
		for _, k := range keys {
			m += protowire.SizeVarint(k)
		}
		n += sizeBytesField(scoreKeysField, m)
	}
	n += sizeString(scoreLoraField, req.GetLoraName())
	n += sizeString(scoreSaltField, req.GetCacheSalt())
	for _, w := range req.GetWorkers() {
		n += sizeBytesField(scoreWorkersField, proto.Size(w))
	}
	for _, e := range req.GetBlockExtraKeys() {
		n += sizeBytesField(scoreExtraKeysField, proto.Size(e))
	}
	for _, l := range req.GetLoads() {
		n += sizeBytesField(scoreLoadsField, proto.Size(l))
	}
	if p := req.GetPolicy(); p != nil {
		n += sizeBytesField(scorePolicyField, proto.Size(p))
	}
	if req.GetExplain() {
		n += protowire.SizeTag(scoreExplainField) + 1
	}
	n += sizeString(scorePromptField, req.GetPrompt())
	for _, m := range req.GetMessages() {
		n += sizeBytesField(scoreMessagesField, proto.Size(m))
	}
	n += sizeString(scoreTenantField, req.GetTenant())
	return n + len(req.ProtoReflect().GetUnknown())
}

// appendScoreRequest appends req's encoding to b, byte for byte what
// protobuf-go's Marshal writes. Sub-messages, which a prompt's request
// rarely has, are encoded by protobuf-go (and sized once more for their
// length prefix).
func appendScoreRequest(b []byte, req *kvindexv1.ScoreRequest) ([]byte, error) {
	b = appendString(b, scoreModelField, req.GetModel())
	if ids := req.GetTokenIds(); len(ids) > 0 {
		// The ids are written after room for the longest length prefix
		// they could need, then moved back to the prefix they do need
		// (a copy of a few KB, cheaper than a pass to size them).
		b = protowire.AppendTag(b, scoreTokensField, protowire.BytesType)
		at := len(b)
		room := protowire.SizeVarint(uint64(maxVarint32 * len(ids)))
		b = appendPackedUint32(slices.Grow(b, room)[:at+room], ids)
		n := len(b) - at - room
		pre := len(protowire.AppendVarint(b[:at], uint64(n))) - at
		if pre < room {
			copy(b[at+pre:], b[at+room:])
			b = b[:at+pre+n]
		}
	}
	if keys := req.GetBlockKeys(); len(keys) > 0 {
		m := 0
		for _, k := range keys {
			m += protowire.SizeVarint(k)
		}
		b = protowire.AppendTag(b, scoreKeysField, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(m))
		for _, k := range keys {
			b = protowire.AppendVarint(b, k)
		}
	}
	b = appendString(b, scoreLoraField, req.GetLoraName())
	b = appendString(b, scoreSaltField, req.GetCacheSalt())
	var err error
	for _, w := range req.GetWorkers() {
		if b, err = appendMessage(b, scoreWorkersField, w); err != nil {
			return nil, err
		}
	}
	for _, e := range req.GetBlockExtraKeys() {
		if b, err = appendMessage(b, scoreExtraKeysField, e); err != nil {
			return nil, err
		}
	}
	for _, l := range req.GetLoads() {
		if b, err = appendMessage(b, scoreLoadsField, l); err != nil {
			return nil, err
		}
	}
	if p := req.GetPolicy(); p != nil {
		if b, err = appendMessage(b, scorePolicyField, p); err != nil {
			return nil, err
		}
	}
	if req.GetExplain() {
		b = protowire.AppendTag(b, scoreExplainField, protowire.VarintType)
		b = append(b, 1)
	}
	b = appendString(b, scorePromptField, req.GetPrompt())
	for _, m := range req.GetMessages() {
		if b, err = appendMessage(b, scoreMessagesField, m); err != nil {
			return nil, err
		}
	}
	b = appendString(b, scoreTenantField, req.GetTenant())
	return append(b, req.ProtoReflect().GetUnknown()...), nil
}

// appendPackedUint32 appends ids as varints, token-sized ones (up to 3
// bytes) inline. Callers size b for 5 bytes per id; the loop writes by
// index into that room. Cost: ~1.4 ns per id (BenchmarkCodecMarshal).
func appendPackedUint32(b []byte, ids []uint32) []byte {
	n := len(b)
	b = slices.Grow(b, maxVarint32*len(ids))[:n+maxVarint32*len(ids)]
	out := b[n:]
	i := 0
	for _, v := range ids {
		switch {
		case v < 1<<7:
			out[i] = byte(v)
			i++
		case v < 1<<14:
			out[i], out[i+1] = byte(v)|0x80, byte(v>>7)
			i += 2
		case v < 1<<21:
			out[i], out[i+1], out[i+2] = byte(v)|0x80, byte(v>>7)|0x80, byte(v>>14)
			i += 3
		default:
			i += len(protowire.AppendVarint(out[i:i], uint64(v)))
		}
	}
	return b[:n+i]
}

// sizeString is the encoded size of a proto3 string field (0 when empty).
func sizeString(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return sizeBytesField(num, len(s))
}

// sizeBytesField is the encoded size of a length-delimited field with an
// n-byte payload.
func sizeBytesField(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeVarint(uint64(n)) + n
}

// appendString appends a proto3 string field, nothing when it is empty.
func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendMessage appends a sub-message field, encoded by protobuf-go
// (MarshalAppend reuses the size that proto.Size just cached).
func appendMessage(b []byte, num protowire.Number, m proto.Message) ([]byte, error) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(proto.Size(m)))
	b, err := (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(b, m)
	if err != nil {
		return nil, fmt.Errorf("api: marshal ScoreRequest: field %d: %w", num, err)
	}
	return b, nil
}

// unmarshalScoreResponse decodes b into resp (reset first) as protobuf-go
// would, when b holds only the fields ScoreResponse defines, each message
// field at most once per message and every string valid UTF-8: what
// kvindex's server writes. It returns false for anything else (unknown
// fields, a sub-message in two parts, invalid input), leaving resp in any
// state: protobuf-go must then decode it, which resets it, merges, keeps
// unknown fields and words the errors. FuzzUnmarshalScoreResponse checks
// the pair against protobuf-go.
//
// Why: protobuf-go allocates every message and string of a reply on its
// own, 70 objects and ~5 µs for 8 workers, on every call of every router
// (BenchmarkCodecUnmarshalResponse; docs/benchmarks.md, gRPC rows). Here
// the workers are counted first (a walk over the reply's top-level
// fields), then one pass fills a slab per message type, with the strings
// in one buffer: 7 allocations for a reply in the server's form.
func unmarshalScoreResponse(b []byte, resp *kvindexv1.ScoreResponse) bool {
	n := 0
	for c := (cursor{b: b}); len(c.b) > 0 && !c.bad; {
		if num, typ := c.tag(); num == 3 && typ == protowire.BytesType {
			n++
			c.bytes()
		} else {
			c.skip(typ)
		}
	}
	proto.Reset(resp)
	d := respDecoder{resp: resp}
	if n > 0 {
		// The server sets every worker's ref and load, and one medium
		// (GPU) for most: a reply in another shape grows a slab, in a new
		// chunk so that the messages already placed stay where they are.
		d.scores = make([]kvindexv1.WorkerScore, 0, n)
		d.ptrs = make([]*kvindexv1.WorkerScore, 0, n)
		d.refs = make([]kvindexv1.WorkerRef, 0, n)
		d.loads = make([]kvindexv1.LoadDetail, 0, n)
		d.media = make([]kvindexv1.MediumMatch, 0, n)
		d.mediaPtrs = make([]*kvindexv1.MediumMatch, 0, n)
		d.sb.Grow(len(b) / 4) // pods, media and sources: ~1/5 of a reply
	}
	if !d.response(b) {
		return false
	}
	if len(d.ptrs) > 0 {
		resp.Workers = d.ptrs
	}
	return true
}

// cursor reads protobuf fields from b, with inline paths for the 1-byte
// tags and varints that make up most of a reply. An error sets bad and
// empties b.
type cursor struct {
	b   []byte
	bad bool
}

func (c *cursor) fail() {
	c.bad = true
	c.b = nil
}

func (c *cursor) tag() (protowire.Number, protowire.Type) {
	if len(c.b) > 0 && c.b[0] < 0x80 {
		t := c.b[0]
		c.b = c.b[1:]
		if t>>3 == 0 {
			c.fail() // field 0 is invalid
			return 0, 0
		}
		return protowire.Number(t >> 3), protowire.Type(t & 7)
	}
	num, typ, n := protowire.ConsumeTag(c.b)
	if n < 0 {
		c.fail()
		return 0, 0
	}
	c.b = c.b[n:]
	return num, typ
}

func (c *cursor) varint() uint64 {
	if len(c.b) > 0 && c.b[0] < 0x80 {
		x := c.b[0]
		c.b = c.b[1:]
		return uint64(x)
	}
	x, n := protowire.ConsumeVarint(c.b)
	if n < 0 {
		c.fail()
		return 0
	}
	c.b = c.b[n:]
	return x
}

func (c *cursor) double() float64 {
	x, n := protowire.ConsumeFixed64(c.b)
	if n < 0 {
		c.fail()
		return 0
	}
	c.b = c.b[n:]
	return math.Float64frombits(x)
}

func (c *cursor) bytes() []byte {
	v, n := protowire.ConsumeBytes(c.b)
	if n < 0 {
		c.fail()
		return nil
	}
	c.b = c.b[n:]
	return v
}

// skip passes over a field's value of wire type typ (groups fail: no
// ScoreResponse field is one, so the hand path never takes them).
func (c *cursor) skip(typ protowire.Type) {
	switch typ {
	case protowire.VarintType:
		c.varint()
	case protowire.Fixed64Type:
		c.double()
	case protowire.BytesType:
		c.bytes()
	case protowire.Fixed32Type:
		if _, n := protowire.ConsumeFixed32(c.b); n >= 0 {
			c.b = c.b[n:]
			return
		}
		c.fail()
	default:
		c.fail()
	}
}

// respDecoder is unmarshalScoreResponse's state: the reply and the slabs
// its messages are placed in (appended to within their capacity, or to a
// new chunk beyond it).
type respDecoder struct {
	resp      *kvindexv1.ScoreResponse
	scores    []kvindexv1.WorkerScore
	ptrs      []*kvindexv1.WorkerScore
	refs      []kvindexv1.WorkerRef
	loads     []kvindexv1.LoadDetail
	media     []kvindexv1.MediumMatch
	mediaPtrs []*kvindexv1.MediumMatch
	// sb holds every string's bytes. Each string is a slice of
	// sb.String() taken after its bytes are written: bytes a Builder has
	// written never change, so the strings stay valid if it grows.
	sb strings.Builder
}

// slot returns a new zero element of *slab, starting a new chunk (of the
// same capacity) when it is full.
func slot[T any](slab *[]T) *T {
	if len(*slab) == cap(*slab) {
		*slab = make([]T, 0, max(cap(*slab), 1))
	}
	*slab = (*slab)[:len(*slab)+1]
	return &(*slab)[len(*slab)-1]
}

// str copies a string field's value into sb, or fails on invalid UTF-8.
func (d *respDecoder) str(c *cursor) string {
	v := c.bytes()
	if !utf8.Valid(v) {
		c.fail()
		return ""
	}
	at := d.sb.Len()
	d.sb.Write(v)
	return d.sb.String()[at:]
}

func (d *respDecoder) response(b []byte) bool {
	c := cursor{b: b}
	for len(c.b) > 0 {
		switch num, typ := c.tag(); {
		case num == 1 && typ == protowire.VarintType:
			d.resp.BlockSize = uint32(c.varint())
		case num == 2 && typ == protowire.VarintType:
			d.resp.PromptBlocks = uint32(c.varint())
		case num == 3 && typ == protowire.BytesType:
			if !d.workerScore(c.bytes()) {
				return false
			}
		case num == 4 && typ == protowire.BytesType:
			d.resp.Policy = d.str(&c)
		default:
			return false
		}
	}
	return !c.bad
}

func (d *respDecoder) workerScore(b []byte) bool {
	ws := slot(&d.scores)
	d.ptrs = append(d.ptrs, ws)
	firstMedium := len(d.mediaPtrs)
	c := cursor{b: b}
	for len(c.b) > 0 {
		switch num, typ := c.tag(); {
		case num == 1 && typ == protowire.BytesType && ws.Worker == nil:
			ws.Worker = slot(&d.refs)
			if !d.workerRef(c.bytes(), ws.Worker) {
				return false
			}
		case num == 2 && typ == protowire.VarintType:
			ws.MatchedBlocks = uint32(c.varint())
		case num == 3 && typ == protowire.VarintType:
			ws.MatchedTokens = uint32(c.varint())
		case num == 4 && typ == protowire.BytesType:
			m := slot(&d.media)
			d.mediaPtrs = append(d.mediaPtrs, m)
			if !d.mediumMatch(c.bytes(), m) {
				return false
			}
		case num == 5 && typ == protowire.VarintType:
			ws.Health = kvindexv1.WorkerHealth(int32(c.varint()))
		case num == 6 && typ == protowire.VarintType:
			ws.SpeculativeBlocks = uint32(c.varint())
		case num == 7 && typ == protowire.Fixed64Type:
			ws.Overlap = c.double()
		case num == 8 && typ == protowire.BytesType && ws.Load == nil:
			ws.Load = slot(&d.loads)
			if !d.loadDetail(c.bytes(), ws.Load) {
				return false
			}
		case num == 9 && typ == protowire.Fixed64Type:
			ws.Penalty = c.double()
		case num == 10 && typ == protowire.Fixed64Type:
			ws.Score = c.double()
		case num == 11 && typ == protowire.BytesType:
			ws.Reason = d.str(&c)
		default:
			return false
		}
	}
	if n := len(d.mediaPtrs); n > firstMedium {
		ws.ByMedium = d.mediaPtrs[firstMedium:n:n]
	}
	return !c.bad
}

func (d *respDecoder) workerRef(b []byte, r *kvindexv1.WorkerRef) bool {
	c := cursor{b: b}
	for len(c.b) > 0 {
		switch num, typ := c.tag(); {
		case num == 1 && typ == protowire.BytesType:
			r.Pod = d.str(&c)
		case num == 2 && typ == protowire.VarintType:
			r.DpRank = uint32(c.varint())
		default:
			return false
		}
	}
	return !c.bad
}

func (d *respDecoder) mediumMatch(b []byte, m *kvindexv1.MediumMatch) bool {
	c := cursor{b: b}
	for len(c.b) > 0 {
		switch num, typ := c.tag(); {
		case num == 1 && typ == protowire.BytesType:
			m.Medium = d.str(&c)
		case num == 2 && typ == protowire.VarintType:
			m.Blocks = uint32(c.varint())
		case num == 3 && typ == protowire.VarintType:
			m.Tokens = uint32(c.varint())
		default:
			return false
		}
	}
	return !c.bad
}

func (d *respDecoder) loadDetail(b []byte, l *kvindexv1.LoadDetail) bool {
	c := cursor{b: b}
	for len(c.b) > 0 {
		switch num, typ := c.tag(); {
		case num == 1 && typ == protowire.VarintType:
			l.Running = uint32(c.varint())
		case num == 2 && typ == protowire.VarintType:
			l.Waiting = uint32(c.varint())
		case num == 3 && typ == protowire.Fixed64Type:
			l.KvCacheUsage = c.double()
		case num == 4 && typ == protowire.VarintType:
			l.InflightRequests = uint32(c.varint())
		case num == 5 && typ == protowire.VarintType:
			l.InflightPrefillTokens = c.varint()
		case num == 6 && typ == protowire.VarintType:
			l.QueuedPrefillTokens = c.varint()
		case num == 7 && typ == protowire.BytesType:
			l.Source = d.str(&c)
		default:
			return false
		}
	}
	return !c.bad
}
