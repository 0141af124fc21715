package api

import (
	"fmt"
	"slices"
	"unicode/utf8"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// maxVarint32 is the longest varint of a uint32.
const maxVarint32 = 5

// scoreTokensField is ScoreRequest.token_ids's field number.
const scoreTokensField protowire.Number = 2

// UnmarshalScoreRequest decodes b into req, merging as protobuf-go does
// (token ids appended to req.TokenIds), accepting and producing what it does
// (FuzzUnmarshalScoreRequest). Cost: ~2 ns a token id; other fields by
// protobuf-go.
func UnmarshalScoreRequest(b []byte, req *kvindexv1.ScoreRequest) error {
	// other starts the current run of non-token fields, each run one
	// protobuf-go call.
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
		// Another field, or token_ids of a wire type protobuf-go rejects.
		m := protowire.ConsumeFieldValue(num, typ, b[pos+n:])
		if m < 0 {
			return fmt.Errorf("api: unmarshal ScoreRequest: field %d: %w", num, protowire.ParseError(m))
		}
		pos += n + m
	}
	return mergeScoreFields(b[other:], req)
}

// mergeScoreFields decodes a run of non-token fields with protobuf-go.
func mergeScoreFields(b []byte, req *kvindexv1.ScoreRequest) error {
	if len(b) == 0 {
		return nil
	}
	if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(b, req); err != nil {
		return fmt.Errorf("api: unmarshal ScoreRequest: %w", err)
	}
	return nil
}

// appendTokenVarints appends the packed varints in b to dst, truncated to 32
// bits. Ids up to 3 bytes (vocabularies to 2 M) are decoded inline, longer
// ones by protowire (a branch-free decode measured 2x slower: it chains each
// position on the previous load). Cost: ~2 ns an id; dst grows at most once,
// to len(b) ids.
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

// marshalScoreRequest encodes req as protobuf-go would, into a buffer of
// pool past gRPC's pooling threshold. ok is false for invalid UTF-8, which
// protobuf-go must reject with its own error.
func marshalScoreRequest(req *kvindexv1.ScoreRequest, pool *requestPool) (data mem.BufferSlice, ok bool, err error) {
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
	buf := pool.Get(size)
	b, err := appendScoreRequest((*buf)[:0], req)
	if err != nil {
		pool.Put(buf)
		return nil, true, err
	}
	*buf = b // the same memory unless a sub-message grew while it was sent
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, true, nil
}

// ScoreRequest's other field numbers, in protobuf-go's write order.
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

// scoreRequestMaxSize bounds req's encoded size: exact but for the token ids,
// counted at 5 bytes each to save a sizing pass.
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

// appendScoreRequest appends req's encoding, byte for byte protobuf-go's;
// sub-messages (rare) by protobuf-go.
func appendScoreRequest(b []byte, req *kvindexv1.ScoreRequest) ([]byte, error) {
	b = appendString(b, scoreModelField, req.GetModel())
	if ids := req.GetTokenIds(); len(ids) > 0 {
		// Written after room for the longest prefix, then moved back (a copy
		// of a few KB, cheaper than a sizing pass).
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

// appendPackedUint32 appends ids as varints, up to 3 bytes inline, writing
// by index into room for 5 bytes an id. Cost: ~1.4 ns an id.
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

// sizeBytesField is the encoded size of a length-delimited n-byte field.
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

// appendMessage appends a sub-message field (reusing proto.Size's cache).
func appendMessage(b []byte, num protowire.Number, m proto.Message) ([]byte, error) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(proto.Size(m)))
	b, err := (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(b, m)
	if err != nil {
		return nil, fmt.Errorf("api: marshal ScoreRequest: field %d: %w", num, err)
	}
	return b, nil
}
