package events

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Encoding selects how AppendPayload writes events (vLLM's two eras).
type Encoding uint8

const (
	// EncodingArray writes tagged positional arrays, trailing nils included
	// (vLLM before PR #42892); EncodeOptions.ArrayFields picks the release.
	EncodingArray Encoding = iota
	// EncodingMap writes maps with a "type" tag (since PR #42892), leaving
	// out nil keys that have a default.
	EncodingMap
)

// String returns the encoding's name.
func (e Encoding) String() string { return enumName("Encoding", e, encodingNames[:]) }

// HashForm selects how AppendPayload writes block hashes.
type HashForm uint8

const (
	// HashUint64 writes hashes as unsigned integers (vLLM >= 0.10.2).
	HashUint64 HashForm = iota
	// HashInt64 writes int64(hash) (vLLM < 0.10.2, SGLang).
	HashInt64
	// HashBin32 writes a 32-byte bin ending in the hash big-endian after a
	// filler derived from it (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
	HashBin32
)

// String returns the hash form's name.
func (h HashForm) String() string { return enumName("HashForm", h, hashNames[:]) }

// Envelope selects the shape of the batch around the events.
type Envelope uint8

const (
	// EnvelopeArray3 writes [ts, events, data_parallel_rank] (vLLM >= 0.9.1).
	EnvelopeArray3 Envelope = iota
	// EnvelopeArray2 writes [ts, events] (vLLM 0.9.0).
	EnvelopeArray2
	// EnvelopeMap writes {"ts", "events", "data_parallel_rank"} (a vLLM branch).
	EnvelopeMap
)

// String returns the envelope's name.
func (e Envelope) String() string { return enumName("Envelope", e, envelopeNames[:]) }

// EncodeOptions says which vLLM release AppendPayload imitates; the zero
// value is the last array-era one (11 fields, uint64 hashes, 3 elements).
type EncodeOptions struct {
	Encoding Encoding
	// ArrayFields is how many fields follow BlockStored's tag: 5 (v0.9),
	// 6 (+medium), 7 (+lora_name), 8 (+extra_keys), 9 (+group_idx) or 11
	// (+kv_cache_spec_kind, _sliding_window); 0 means 11. BlockRemoved's
	// follow (removedFields).
	ArrayFields int
	HashForm    HashForm
	Envelope    Envelope
}

// errEncode is wrapped by every AppendPayload error.
var errEncode = errors.New("events: cannot encode")

// AppendPayload appends b byte for byte as vLLM's msgspec publisher sends
// it. "" strings are written as nil (a non-GPU Medium's empty MediumName as
// Medium.String()). Locality is written in the map era only (the array era
// predates it); b.UnknownEvents are not written. It does not validate what the decoder does, so tests can
// build bad payloads. On error it returns dst unchanged.
func AppendPayload(dst []byte, b *Batch, opt EncodeOptions) ([]byte, error) {
	orig := dst
	fail := func(format string, args ...any) ([]byte, error) {
		return orig, fmt.Errorf("%w: "+format, append([]any{errEncode}, args...)...)
	}
	stored := cmp.Or(opt.ArrayFields, 11)
	removed, ok := removedFields[stored]
	if !ok {
		return fail("ArrayFields %d is no vLLM release (want 5, 6, 7, 8, 9 or 11)", opt.ArrayFields)
	}
	if opt.Encoding > EncodingMap || opt.HashForm > HashBin32 || opt.Envelope > EnvelopeMap {
		// Each option prints its name, or its type and number when unknown.
		return fail("unknown option in %v, %v, %v", opt.Encoding, opt.HashForm, opt.Envelope)
	}
	e := encoder{opt: opt, stored: stored, removed: removed}

	switch opt.Envelope {
	case EnvelopeArray3:
		dst = append(dst, 0x93)
	case EnvelopeArray2:
		dst = append(dst, 0x92)
	case EnvelopeMap:
		dst = appendStr(append(dst, 0x83), "ts")
	}
	dst = appendFloat64(dst, b.Timestamp)
	if opt.Envelope == EnvelopeMap {
		dst = appendStr(dst, "events")
	}
	dst = appendArrayLen(dst, len(b.Events))
	for i := range b.Events {
		var err error
		if dst, err = e.appendEvent(dst, &b.Events[i]); err != nil {
			return fail("event %d (%s): %w", i, b.Events[i].Kind, err)
		}
	}
	if opt.Envelope == EnvelopeMap {
		dst = appendStr(dst, "data_parallel_rank")
	}
	if opt.Envelope != EnvelopeArray2 {
		if b.HasDPRank {
			dst = appendInt(dst, int64(b.DPRank))
		} else {
			dst = appendNil(dst)
		}
	}
	return dst, nil
}

// removedFields is how many fields follow BlockRemoved's tag in the release
// whose BlockStored has the key's.
var removedFields = map[int]int{5: 1, 6: 2, 7: 2, 8: 2, 9: 3, 11: 3}

type encoder struct {
	opt             EncodeOptions
	stored, removed int // positional fields after the tag
}

func (e *encoder) appendEvent(dst []byte, ev *Event) ([]byte, error) {
	switch ev.Kind {
	case KindBlockStored, KindBlockRemoved, KindAllBlocksCleared:
	default:
		return dst, fmt.Errorf("unknown kind %v", ev.Kind)
	}
	if e.opt.Encoding == EncodingMap {
		return e.appendMapEvent(dst, ev)
	}
	var order []field
	switch ev.Kind {
	case KindBlockStored:
		order = storedOrder[:e.stored]
	case KindBlockRemoved:
		order = removedOrder[:e.removed]
	}
	dst = appendArrayLen(dst, 1+len(order))
	dst = appendStr(dst, ev.Kind.String())
	for _, f := range order {
		var err error
		if dst, err = e.appendField(dst, ev, f); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// appendMapEvent writes the tag, then the fields in declaration order,
// leaving out nil fields that have a default.
func (e *encoder) appendMapEvent(dst []byte, ev *Event) ([]byte, error) {
	var fields [numFields]field
	n := 0
	add := func(f field, present bool) {
		if present {
			fields[n] = f
			n++
		}
	}
	switch ev.Kind {
	case KindBlockStored:
		for f := fBlockHashes; f <= fLoRAName; f++ { // always present
			add(f, true)
		}
		add(fExtraKeys, ev.ExtraKeys != nil)
		add(fGroupIdx, ev.HasGroupIdx)
		add(fSpecKind, ev.SpecKind != "")
		add(fSlidingWindow, ev.HasSlidingWindow)
		add(fCacheSalt, ev.CacheSalt != "")
		add(fLocality, ev.Locality != LocalityLocal)
	case KindBlockRemoved:
		add(fBlockHashes, true)
		add(fMedium, true)
		add(fGroupIdx, ev.HasGroupIdx)
		add(fLocality, ev.Locality != LocalityLocal)
	}
	dst = appendMapLen(dst, 1+n)
	dst = appendStr(dst, "type")
	dst = appendStr(dst, ev.Kind.String())
	for _, f := range fields[:n] {
		dst = appendStr(dst, fieldNames[f])
		var err error
		if dst, err = e.appendField(dst, ev, f); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

func (e *encoder) appendField(dst []byte, ev *Event, f field) ([]byte, error) {
	switch f {
	case fBlockHashes:
		dst = appendArrayLen(dst, len(ev.BlockHashes))
		for _, h := range ev.BlockHashes {
			dst = e.appendHash(dst, h)
		}
	case fParent:
		if !ev.HasParent {
			return appendNil(dst), nil
		}
		dst = e.appendHash(dst, ev.ParentHash)
	case fTokenIDs:
		dst = appendArrayLen(dst, len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			dst = appendUint(dst, uint64(t))
		}
	case fBlockSize:
		dst = appendInt(dst, int64(ev.BlockSize))
	case fLoRAID:
		if !ev.HasLoRAID {
			return appendNil(dst), nil
		}
		dst = appendInt(dst, ev.LoRAID)
	case fMedium:
		name := ev.MediumName
		if name == "" && ev.Medium != MediumGPU && ev.Locality == LocalityLocal {
			name = ev.Medium.String() // a remote block's class comes from its locality
		}
		dst = appendStrOrNil(dst, name)
	case fLoRAName:
		dst = appendStrOrNil(dst, ev.LoRAName)
	case fExtraKeys:
		if ev.ExtraKeys == nil {
			return appendNil(dst), nil
		}
		dst = appendArrayLen(dst, len(ev.ExtraKeys))
		for i, k := range ev.ExtraKeys {
			var err error
			if dst, err = appendExtraKeys(dst, k); err != nil {
				return dst, fmt.Errorf("extra_keys[%d]: %w", i, err)
			}
		}
	case fGroupIdx:
		if !ev.HasGroupIdx {
			return appendNil(dst), nil
		}
		dst = appendInt(dst, int64(ev.GroupIdx))
	case fSpecKind:
		dst = appendStrOrNil(dst, ev.SpecKind)
	case fSlidingWindow:
		if !ev.HasSlidingWindow {
			return appendNil(dst), nil
		}
		dst = appendInt(dst, int64(ev.SlidingWindow))
	case fCacheSalt:
		dst = appendStrOrNil(dst, ev.CacheSalt)
	case fLocality:
		dst = appendStr(dst, ev.Locality.String())
	}
	return dst, nil
}

func (e *encoder) appendHash(dst []byte, h uint64) []byte {
	switch e.opt.HashForm {
	case HashInt64:
		return appendInt(dst, int64(h))
	case HashBin32:
		dst = append(dst, 0xc4, 32)
		x := h
		for range 3 {
			x = splitmix64(x)
			dst = binary.BigEndian.AppendUint64(dst, x)
		}
		return binary.BigEndian.AppendUint64(dst, h)
	}
	return appendUint(dst, h)
}

// splitmix64 is one SplitMix64 step: a fixed filler for a folded digest.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// appendExtraKeys writes one block's extra keys as msgspec would: nil or a tuple.
func appendExtraKeys(dst []byte, k ExtraKeys) ([]byte, error) {
	if k == nil {
		return appendNil(dst), nil
	}
	if len(k) == 0 || k[0] != 't' {
		return dst, fmt.Errorf("%w: top level is not a tuple", ErrExtraKeys)
	}
	v, err := k.Values()
	if err != nil {
		return dst, err
	}
	return appendValue(dst, v), nil
}

// appendValue writes a value of ExtraKeys.Values as msgpack.
func appendValue(dst []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return appendNil(dst)
	case bool:
		if x {
			return append(dst, 0xc3)
		}
		return append(dst, 0xc2)
	case int64:
		return appendInt(dst, x)
	case uint64:
		return appendUint(dst, x)
	case float64:
		return appendFloat64(dst, x)
	case string:
		return appendStr(dst, x)
	case []byte:
		return appendBin(dst, x)
	}
	t := v.([]any)
	dst = appendArrayLen(dst, len(t))
	for _, e := range t {
		dst = appendValue(dst, e)
	}
	return dst
}

// The append* helpers write msgspec's (smallest) forms; tests check them
// against vmihailenco's Encoder.

func appendNil(dst []byte) []byte { return append(dst, 0xc0) }

func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xcf), v)
}

func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(dst, uint64(v))
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, 0xd1), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
}

func appendFloat64(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(f))
}

func appendStrLen(dst []byte, n int) []byte {
	switch {
	case n < 32:
		return append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		return append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xda), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
}

func appendStr(dst []byte, s string) []byte { return append(appendStrLen(dst, len(s)), s...) }

func appendStrOrNil(dst []byte, s string) []byte {
	if s == "" {
		return appendNil(dst)
	}
	return appendStr(dst, s)
}

func appendBin(dst, b []byte) []byte {
	switch n := len(b); {
	case n <= math.MaxUint8:
		dst = append(dst, 0xc4, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xc5), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xc6), uint32(n))
	}
	return append(dst, b...)
}

func appendArrayLen(dst []byte, n int) []byte { return appendLen(dst, n, 0x90, 0xdc) }

func appendMapLen(dst []byte, n int) []byte { return appendLen(dst, n, 0x80, 0xde) }

// appendLen writes an array or map header: fix|n, code16 or code16+1.
func appendLen(dst []byte, n int, fix, code16 byte) []byte {
	switch {
	case n < 16:
		return append(dst, fix|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, code16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, code16+1), uint32(n))
}
