package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// ErrMalformed is wrapped by every error that Decode and Decoder.Decode
// return: the payload is not a KV event batch in any form vLLM (or SGLang)
// sends. The wrapping error says what was wrong, in which event and field,
// at which byte offset, and quotes the bytes around it.
var ErrMalformed = errors.New("events: malformed payload")

// minEventLen is the size of the smallest event that can decode: a fixarray
// header and the shortest tag, fixstr "BlockStored". It bounds how many
// events a payload can claim.
const minEventLen = 1 + 1 + len("BlockStored")

// field identifies an event field; the order is BlockStored's positional
// order in the array era.
type field uint8

const (
	fBlockHashes field = iota
	fParent
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	numFields
	fType    // the map era's tag key
	fUnknown // a key kvindex does not know: skipped
)

var fieldNames = [numFields]string{
	"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
	"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
	"kv_cache_spec_sliding_window",
}

// storedOrder and removedOrder are the positional fields after the tag in the
// array era; older vLLM releases send a prefix of them.
var (
	storedOrder = [...]field{
		fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoRAID, fMedium,
		fLoRAName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow,
	}
	removedOrder = [...]field{fBlockHashes, fMedium, fGroupIdx}
)

// fieldMask says which fields each Kind has; other map keys are skipped.
func fieldMask(k Kind) uint32 {
	switch k {
	case KindBlockStored:
		return 1<<numFields - 1
	case KindBlockRemoved:
		return 1<<fBlockHashes | 1<<fMedium | 1<<fGroupIdx
	}
	return 0
}

func positionalOrder(k Kind) []field {
	switch k {
	case KindBlockStored:
		return storedOrder[:]
	case KindBlockRemoved:
		return removedOrder[:]
	}
	return nil
}

func fieldByName(key []byte) field {
	switch string(key) {
	case "type":
		return fType
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow
	}
	return fUnknown
}

// Decoder decodes vLLM KV event payloads (msgpack) into Batches. It keeps
// scratch state between calls so that decoding a stream of payloads into
// the same Batch does not allocate in the steady state.
//
// A Decoder is not safe for concurrent use; use one per goroutine. The zero
// value is ready to use, but a Decoder must not be copied after first use.
type Decoder struct {
	r       bytes.Reader
	dec     *msgpack.Decoder
	payload []byte

	// Where the decoder is, for error messages.
	event int    // index of the event being decoded, -1 in the envelope
	kind  Kind   // its kind, 0 before the tag is read
	field string // field name, "" for none
	key   []byte // unknown map key being skipped (aliases payload)
	index int    // element index within field, -1 for none
	path  []int  // extra_keys tuple indices below index

	spareExtra []ExtraKeys // the event's previous ExtraKeys, for reuse
	lastLoRA   string      // last LoRA name, reused to avoid an allocation
}

// NewDecoder returns a Decoder ready to decode payloads.
func NewDecoder() *Decoder {
	d := new(Decoder)
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}

// Decode is a convenience that decodes one payload into a new Batch with a
// throwaway Decoder. Use a Decoder and Decoder.Decode to reuse memory.
func Decode(payload []byte) (*Batch, error) {
	var d Decoder
	b := new(Batch)
	if err := d.Decode(payload, b); err != nil {
		return nil, err
	}
	return b, nil
}

// Decode decodes one payload (the third frame of a vLLM KV event message, or
// the last frame of a replay reply) into b, replacing b's contents.
//
// Ownership: Decode reuses the capacity of b.Events and of each event's
// BlockHashes, TokenIDs and ExtraKeys slices, so whatever b held before,
// including slices a caller kept from it, is overwritten. b's contents are
// valid until the next Decode into the same Batch. payload is not retained:
// every string and byte slice in b is a copy. Slices with no elements may be
// nil or empty; test their length (ExtraKeys is the exception: nil means the
// engine sent no extra_keys).
//
// Every error wraps ErrMalformed. On error b holds a partial result that must
// not be used, but b may be passed to Decode again.
func (d *Decoder) Decode(payload []byte, b *Batch) error {
	if d.dec == nil {
		d.dec = msgpack.NewDecoder(&d.r)
	}
	d.r.Reset(payload)
	d.payload = payload
	d.event, d.kind, d.field, d.key, d.index, d.path = -1, 0, "", nil, -1, d.path[:0]
	err := d.decodeBatch(b)
	d.r.Reset(nil)
	d.payload, d.key, d.spareExtra = nil, nil, nil
	return err
}

// off is the offset of the next unread byte.
func (d *Decoder) off() int { return len(d.payload) - d.r.Len() }

// seek moves to an offset already checked to be within the payload.
func (d *Decoder) seek(off int) { _, _ = d.r.Seek(int64(off), io.SeekStart) }

func (d *Decoder) decodeBatch(b *Batch) error {
	b.Timestamp, b.DPRank, b.HasDPRank = 0, 0, false
	if len(d.payload) == 0 {
		return d.errorf(0, "empty payload, want a msgpack envelope [ts, events, data_parallel_rank]")
	}
	off := 0
	c, err := d.peek(off)
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := d.arrayLen(off, c, 1)
		if err != nil {
			return err
		}
		if n < 2 {
			return d.errorf(off, "envelope is an array of %d elements, want at least 2 (ts, events)", n)
		}
		d.field = "ts"
		if b.Timestamp, err = d.readFloat(); err != nil {
			return err
		}
		d.field = "events"
		if err := d.decodeEvents(b); err != nil {
			return err
		}
		if n >= 3 {
			d.field = "data_parallel_rank"
			if err := d.decodeRank(b); err != nil {
				return err
			}
		}
		for i := 3; i < n; i++ {
			d.field, d.index = "(extra element)", i
			if err := d.skip(); err != nil {
				return err
			}
		}
	case isMap(c):
		n, err := d.mapLen(off, c)
		if err != nil {
			return err
		}
		var seenTS, seenEvents bool
		for i := 0; i < n; i++ {
			d.field, d.key, d.index = "(key)", nil, i
			key, err := d.readStr()
			if err != nil {
				return err
			}
			d.index = -1
			switch string(key) {
			case "ts":
				d.field = "ts"
				if b.Timestamp, err = d.readFloat(); err != nil {
					return err
				}
				seenTS = true
			case "events":
				d.field = "events"
				if err := d.decodeEvents(b); err != nil {
					return err
				}
				seenEvents = true
			case "data_parallel_rank":
				d.field = "data_parallel_rank"
				if err := d.decodeRank(b); err != nil {
					return err
				}
			default:
				d.field, d.key = "", key
				if err := d.skip(); err != nil {
					return err
				}
			}
		}
		d.field, d.key = "", nil
		if !seenTS || !seenEvents {
			missing := "ts"
			if seenTS {
				missing = "events"
			}
			return d.errorf(off, "envelope map has no %q key", missing)
		}
	default:
		return d.typeErr(off, c, "envelope array or map")
	}
	d.field, d.key, d.index = "", nil, -1
	if rest := d.r.Len(); rest != 0 {
		return d.errorf(d.off(), "%d trailing bytes after the envelope", rest)
	}
	return nil
}

func (d *Decoder) decodeRank(b *Batch) error {
	isNil, err := d.takeNil()
	if err != nil || isNil {
		b.DPRank, b.HasDPRank = 0, false
		return err
	}
	v, err := d.readInt(math.MinInt, math.MaxInt)
	b.DPRank, b.HasDPRank = int(v), err == nil
	return err
}

func (d *Decoder) decodeEvents(b *Batch) error {
	off := d.off()
	c, err := d.peek(off)
	if err != nil {
		return err
	}
	if !isArray(c) {
		return d.typeErr(off, c, "array of events")
	}
	n, err := d.arrayLen(off, c, minEventLen)
	if err != nil {
		return err
	}
	evs := b.Events
	if cap(evs) < n {
		grown := make([]Event, n)
		copy(grown, evs[:cap(evs)]) // keep old events' slices for reuse
		evs = grown
	}
	evs = evs[:n]
	b.Events = evs
	field := d.field
	for i := range evs {
		d.event, d.kind, d.field, d.key, d.index = i, 0, "", nil, -1
		if err := d.decodeEvent(&evs[i]); err != nil {
			return err
		}
	}
	d.event, d.kind, d.field, d.key, d.index = -1, 0, field, nil, -1
	return nil
}

func (d *Decoder) decodeEvent(e *Event) error {
	d.spareExtra = e.ExtraKeys
	*e = Event{BlockHashes: e.BlockHashes[:0], TokenIDs: e.TokenIDs[:0]}
	off := d.off()
	c, err := d.peek(off)
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		err = d.decodeArrayEvent(e, off, c)
	case isMap(c):
		err = d.decodeMapEvent(e, off, c)
	default:
		return d.typeErr(off, c, "event array or map")
	}
	if err != nil {
		return err
	}
	d.field, d.key, d.index = "", nil, -1
	if e.Kind == KindBlockStored && e.ExtraKeys != nil && len(e.ExtraKeys) != len(e.BlockHashes) {
		return d.errorf(off, "extra_keys has %d entries for %d block hashes, want one per block",
			len(e.ExtraKeys), len(e.BlockHashes))
	}
	return nil
}

// decodeArrayEvent decodes the array era's [tag, field...].
func (d *Decoder) decodeArrayEvent(e *Event, off int, c byte) error {
	n, err := d.arrayLen(off, c, 1)
	if err != nil {
		return err
	}
	if n == 0 {
		return d.errorf(off, "event is an empty array, want [tag, fields...]")
	}
	d.field = "type"
	if e.Kind, err = d.readTag(); err != nil {
		return err
	}
	order := positionalOrder(e.Kind)
	for i := 1; i < n; i++ {
		if i-1 < len(order) {
			f := order[i-1]
			d.field = fieldNames[f]
			if err := d.decodeField(e, f); err != nil {
				return err
			}
			continue
		}
		d.field, d.index = "(trailing field)", i
		if err := d.skip(); err != nil {
			return err
		}
	}
	return nil
}

// decodeMapEvent decodes the map era's {"type": tag, name: value...} in any
// key order, skipping keys it does not know.
func (d *Decoder) decodeMapEvent(e *Event, off int, c byte) error {
	n, err := d.mapLen(off, c)
	if err != nil {
		return err
	}
	start, i := d.off(), 0
	if n > 0 {
		// msgspec writes the tag first; otherwise look ahead for it.
		d.field = "(key)"
		key, err := d.readStr()
		if err != nil {
			return err
		}
		if string(key) == "type" {
			d.field = "type"
			if e.Kind, err = d.readTag(); err != nil {
				return err
			}
			i = 1
		} else {
			d.seek(start)
			if e.Kind, err = d.findTag(n); err != nil {
				return err
			}
			d.seek(start)
		}
	}
	if e.Kind == 0 {
		d.field, d.key = "", nil
		return d.errorf(off, "event map has no \"type\" key")
	}
	mask := fieldMask(e.Kind)
	for ; i < n; i++ {
		d.field, d.key, d.index = "(key)", nil, -1
		keyOff := d.off()
		key, err := d.readStr()
		if err != nil {
			return err
		}
		f := fieldByName(key)
		switch {
		case f == fType:
			d.field = "type"
			k := e.Kind
			if e.Kind, err = d.readTag(); err != nil {
				return err
			}
			if e.Kind != k {
				return d.errorf(keyOff, "second \"type\" key says %s, first said %s", e.Kind, k)
			}
		case f < numFields && mask&(1<<f) != 0:
			d.field = fieldNames[f]
			if err := d.decodeField(e, f); err != nil {
				return err
			}
		default:
			d.field, d.key = "", key
			if err := d.skip(); err != nil {
				return err
			}
		}
	}
	return nil
}

// findTag scans the n pairs of an event map for the "type" key and returns
// the kind it names, or 0 if there is none. It leaves the reader anywhere.
func (d *Decoder) findTag(n int) (Kind, error) {
	for i := 0; i < n; i++ {
		d.field, d.key = "(key)", nil
		key, err := d.readStr()
		if err != nil {
			return 0, err
		}
		if string(key) == "type" {
			d.field = "type"
			return d.readTag()
		}
		d.field, d.key = "", key
		if err := d.skip(); err != nil {
			return 0, err
		}
	}
	return 0, nil
}

// readTag reads an event tag and sets d.kind.
func (d *Decoder) readTag() (Kind, error) {
	off := d.off()
	tag, err := d.readStr()
	if err != nil {
		return 0, err
	}
	var k Kind
	switch string(tag) {
	case "BlockStored":
		k = KindBlockStored
	case "BlockRemoved":
		k = KindBlockRemoved
	case "AllBlocksCleared":
		k = KindAllBlocksCleared
	default:
		if len(tag) > 40 {
			tag = tag[:40]
		}
		return 0, d.errorf(off, "unknown event tag %q", tag)
	}
	d.kind = k
	return k, nil
}

// decodeField decodes the value of field f into e. nil leaves the field at
// its zero value (or its Has flag false).
func (d *Decoder) decodeField(e *Event, f field) error {
	isNil, err := d.takeNil()
	if err != nil {
		return err
	}
	switch f {
	case fBlockHashes:
		e.BlockHashes = e.BlockHashes[:0]
		if isNil {
			return nil
		}
		n, err := d.readArrayLen(1)
		if err != nil {
			return err
		}
		h := resize(e.BlockHashes, n)
		e.BlockHashes = h
		for i := range h {
			d.index = i
			if h[i], err = d.readHash(); err != nil {
				return err
			}
		}
		d.index = -1
	case fParent:
		e.ParentHash, e.HasParent = 0, false
		if !isNil {
			e.ParentHash, err = d.readHash()
			e.HasParent = err == nil
		}
	case fTokenIDs:
		e.TokenIDs = e.TokenIDs[:0]
		if isNil {
			return nil
		}
		n, err := d.readArrayLen(1)
		if err != nil {
			return err
		}
		t := resize(e.TokenIDs, n)
		e.TokenIDs = t
		for i := range t {
			d.index = i
			v, err := d.readInt(0, math.MaxUint32)
			if err != nil {
				return err
			}
			t[i] = uint32(v)
		}
		d.index = -1
	case fBlockSize:
		e.BlockSize = 0
		if !isNil {
			var v int64
			v, err = d.readInt(math.MinInt, math.MaxInt)
			e.BlockSize = int(v)
		}
	case fLoRAID:
		e.LoRAID, e.HasLoRAID = 0, false
		if !isNil {
			e.LoRAID, err = d.readInt(math.MinInt64, math.MaxInt64)
			e.HasLoRAID = err == nil
		}
	case fMedium:
		e.Medium, e.MediumName = MediumGPU, ""
		if !isNil {
			var s []byte
			if s, err = d.readStr(); err == nil {
				e.MediumName = internMedium(s)
				e.Medium, _ = ParseMedium(e.MediumName)
			}
		}
	case fLoRAName:
		e.LoRAName = ""
		if !isNil {
			var s []byte
			if s, err = d.readStr(); err == nil {
				if string(s) != d.lastLoRA {
					d.lastLoRA = string(s)
				}
				e.LoRAName = d.lastLoRA
			}
		}
	case fExtraKeys:
		return d.decodeExtraKeys(e, isNil)
	case fGroupIdx:
		e.GroupIdx, e.HasGroupIdx = 0, false
		if !isNil {
			var v int64
			v, err = d.readInt(math.MinInt, math.MaxInt)
			e.GroupIdx, e.HasGroupIdx = int(v), err == nil
		}
	case fSpecKind:
		e.SpecKind = ""
		if !isNil {
			var s []byte
			if s, err = d.readStr(); err == nil {
				e.SpecKind = internSpecKind(s)
			}
		}
	case fSlidingWindow:
		e.SlidingWindow, e.HasSlidingWindow = 0, false
		if !isNil {
			var v int64
			v, err = d.readInt(math.MinInt, math.MaxInt)
			e.SlidingWindow, e.HasSlidingWindow = int(v), err == nil
		}
	}
	return err
}

// decodeExtraKeys decodes extra_keys: nil, or one entry per block, each nil
// or a tuple, into canonical ExtraKeys, reusing the event's old buffers.
func (d *Decoder) decodeExtraKeys(e *Event, isNil bool) error {
	ek := e.ExtraKeys
	if ek == nil {
		ek = d.spareExtra
	}
	d.spareExtra = nil
	if isNil {
		e.ExtraKeys = nil
		d.spareExtra = ek
		return nil
	}
	n, err := d.readArrayLen(1)
	if err != nil {
		return err
	}
	if cap(ek) < n {
		grown := make([]ExtraKeys, n)
		copy(grown, ek[:cap(ek)]) // keep old entries' buffers for reuse
		ek = grown
	} else if ek == nil {
		ek = make([]ExtraKeys, 0) // non-nil: extra_keys was sent, even if empty
	}
	ek = ek[:n]
	e.ExtraKeys = ek
	for i := range ek {
		d.index = i
		off := d.off()
		c, err := d.peek(off)
		if err != nil {
			return err
		}
		switch {
		case c == 0xc0:
			_ = d.dec.DecodeNil()
			ek[i] = nil
		case isArray(c):
			buf, err := d.appendExtraValue(ek[i][:0], 0)
			if err != nil {
				return err
			}
			ek[i] = buf
		default:
			return d.typeErr(off, c, "tuple (array) or nil per block")
		}
	}
	d.index = -1
	return nil
}

// appendExtraValue appends the canonical encoding (see ExtraKeys) of the next
// msgpack value, which sits at nesting depth depth (a block's tuple is 0).
func (d *Decoder) appendExtraValue(dst []byte, depth int) ([]byte, error) {
	off := d.off()
	if depth > maxExtraDepth {
		return dst, d.errorf(off, "extra keys nested deeper than %d", maxExtraDepth)
	}
	c, err := d.peek(off)
	if err != nil {
		return dst, err
	}
	switch {
	case c == 0xc0:
		_ = d.dec.DecodeNil()
		return AppendNone(dst), nil
	case c == 0xc2 || c == 0xc3:
		_, _ = d.dec.DecodeBool()
		return AppendBool(dst, c == 0xc3), nil
	case isInt(c):
		v, neg, err := d.readRawInt(off, c)
		if err != nil {
			return dst, err
		}
		if neg {
			return AppendInt(dst, int64(v)), nil
		}
		return AppendUint(dst, v), nil
	case c == 0xca || c == 0xcb:
		f, err := d.dec.DecodeFloat64()
		if err != nil {
			return dst, d.ioErr(off, c, err)
		}
		return AppendFloat(dst, f), nil
	case isStr(c):
		s, err := d.readStr()
		if err != nil {
			return dst, err
		}
		return appendExtraString(dst, s), nil
	case isBin(c):
		b, err := d.readBin()
		if err != nil {
			return dst, err
		}
		return AppendBytes(dst, b), nil
	case isArray(c):
		n, err := d.arrayLen(off, c, 1)
		if err != nil {
			return dst, err
		}
		dst = AppendTuple(dst, n)
		d.path = append(d.path, 0)
		for i := 0; i < n; i++ {
			d.path[len(d.path)-1] = i
			if dst, err = d.appendExtraValue(dst, depth+1); err != nil {
				return dst, err
			}
		}
		d.path = d.path[:len(d.path)-1]
		return dst, nil
	}
	return dst, d.typeErr(off, c, "str, bin, int, float, bool, nil or tuple in extra keys")
}

// appendExtraString is AppendString(dst, string(s)) without converting s.
func appendExtraString(dst, s []byte) []byte {
	dst = binary.AppendUvarint(append(dst, 's'), uint64(len(s)))
	return append(dst, s...)
}

// readHash reads a block hash: an unsigned or signed integer (kept as its
// 64-bit two's complement), or a bin of at least 8 bytes folded to its last
// 8 bytes read big-endian, as vLLM folds its digests.
func (d *Decoder) readHash() (uint64, error) {
	off := d.off()
	c, err := d.peek(off)
	if err != nil {
		return 0, err
	}
	switch {
	case isInt(c):
		v, _, err := d.readRawInt(off, c)
		return v, err
	case isBin(c):
		b, err := d.readBin()
		if err != nil {
			return 0, err
		}
		if len(b) < 8 {
			return 0, d.errorf(off, "bin hash of %d bytes, want at least 8", len(b))
		}
		return binary.BigEndian.Uint64(b[len(b)-8:]), nil
	}
	return 0, d.typeErr(off, c, "integer or bin block hash")
}

// readInt reads an integer in [lo, hi].
func (d *Decoder) readInt(lo, hi int64) (int64, error) {
	off := d.off()
	c, err := d.peek(off)
	if err != nil {
		return 0, err
	}
	if !isInt(c) {
		return 0, d.typeErr(off, c, "integer")
	}
	v, neg, err := d.readRawInt(off, c)
	switch {
	case err != nil:
		return 0, err
	case neg && int64(v) < lo:
		return 0, d.errorf(off, "integer %d out of range [%d, %d]", int64(v), lo, hi)
	case !neg && v > uint64(hi):
		return 0, d.errorf(off, "integer %d out of range [%d, %d]", v, lo, hi)
	}
	return int64(v), nil
}

// readRawInt reads the integer whose code c was peeked, returning its 64-bit
// two's complement and whether it is negative. Positive forms go through
// DecodeUint64 so that values >= 2^63 survive.
func (d *Decoder) readRawInt(off int, c byte) (uint64, bool, error) {
	if c <= 0x7f || (c >= 0xcc && c <= 0xcf) {
		v, err := d.dec.DecodeUint64()
		if err != nil {
			return 0, false, d.ioErr(off, c, err)
		}
		return v, false, nil
	}
	v, err := d.dec.DecodeInt64()
	if err != nil {
		return 0, false, d.ioErr(off, c, err)
	}
	return uint64(v), v < 0, nil
}

// readFloat reads a float32, float64 or integer as float64.
func (d *Decoder) readFloat() (float64, error) {
	off := d.off()
	c, err := d.peek(off)
	if err != nil {
		return 0, err
	}
	switch {
	case c == 0xca || c == 0xcb:
		f, err := d.dec.DecodeFloat64()
		if err != nil {
			return 0, d.ioErr(off, c, err)
		}
		return f, nil
	case isInt(c):
		v, neg, err := d.readRawInt(off, c)
		if neg {
			return float64(int64(v)), err
		}
		return float64(v), err
	}
	return 0, d.typeErr(off, c, "float")
}

// readStr reads a str and returns its bytes, which alias the payload.
func (d *Decoder) readStr() ([]byte, error) {
	off := d.off()
	c, err := d.peek(off)
	if err != nil {
		return nil, err
	}
	if !isStr(c) {
		return nil, d.typeErr(off, c, "str")
	}
	return d.readBody(off, c)
}

// readBin reads a bin and returns its bytes, which alias the payload.
func (d *Decoder) readBin() ([]byte, error) {
	off := d.off()
	c, err := d.peek(off)
	if err != nil {
		return nil, err
	}
	if !isBin(c) {
		return nil, d.typeErr(off, c, "bin")
	}
	return d.readBody(off, c)
}

// readBody reads the length of the str or bin at off and returns its body
// as a slice of the payload (msgpack's DecodeString and DecodeBytes would
// copy it).
func (d *Decoder) readBody(off int, c byte) ([]byte, error) {
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return nil, d.ioErr(off, c, err)
	}
	pos := d.off()
	if n < 0 || n > len(d.payload)-pos {
		return nil, d.errorf(off, "%s of %d bytes overruns the payload (%d bytes left)", codeName(c), uint32(n), len(d.payload)-pos)
	}
	d.seek(pos + n)
	return d.payload[pos : pos+n : pos+n], nil
}

// readArrayLen reads an array header whose elements take at least minElem
// bytes each.
func (d *Decoder) readArrayLen(minElem int) (int, error) {
	off := d.off()
	c, err := d.peek(off)
	if err != nil {
		return 0, err
	}
	if !isArray(c) {
		return 0, d.typeErr(off, c, "array")
	}
	return d.arrayLen(off, c, minElem)
}

// arrayLen reads the header of the array at off and checks that its n
// elements of at least minElem bytes each fit in what is left, so that no
// length prefix can make the decoder allocate more than the payload can hold.
func (d *Decoder) arrayLen(off int, c byte, minElem int) (int, error) {
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return 0, d.ioErr(off, c, err)
	}
	if left := d.r.Len(); n < 0 || n > left/minElem {
		if minElem > 1 {
			return 0, d.errorf(off, "array of %d elements of at least %d bytes each cannot fit in the %d bytes left",
				uint32(n), minElem, left)
		}
		return 0, d.errorf(off, "array of %d elements cannot fit in the %d bytes left", uint32(n), left)
	}
	return n, nil
}

// mapLen reads the header of the map at off, checking that its pairs fit.
func (d *Decoder) mapLen(off int, c byte) (int, error) {
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return 0, d.ioErr(off, c, err)
	}
	if left := d.r.Len(); n < 0 || n > left/2 {
		return 0, d.errorf(off, "map of %d pairs cannot fit in the %d bytes left", uint32(n), left)
	}
	return n, nil
}

// takeNil consumes a nil if one is next.
func (d *Decoder) takeNil() (bool, error) {
	off := d.off()
	c, err := d.peek(off)
	if err != nil || c != 0xc0 {
		return false, err
	}
	if err := d.dec.DecodeNil(); err != nil {
		return false, d.ioErr(off, c, err)
	}
	return true, nil
}

// peek returns the next code without consuming it.
func (d *Decoder) peek(off int) (byte, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, d.errorf(off, "unexpected end of payload")
	}
	return c, nil
}

// skip skips one value of any type, iteratively (so nesting cannot exhaust
// the stack) and without allocating: msgpack's Skip recurses and allocates
// buffers for the bodies it skips.
func (d *Decoder) skip() error {
	for pending := 1; pending > 0; {
		pending--
		off := d.off()
		c, err := d.peek(off)
		if err != nil {
			return err
		}
		switch {
		case isArray(c):
			n, err := d.arrayLen(off, c, 1)
			if err != nil {
				return err
			}
			if n > d.r.Len()-pending {
				return d.errorf(off, "array of %d elements cannot fit in the bytes left", n)
			}
			pending += n
		case isMap(c):
			n, err := d.mapLen(off, c)
			if err != nil {
				return err
			}
			if 2*n > d.r.Len()-pending {
				return d.errorf(off, "map of %d pairs cannot fit in the bytes left", n)
			}
			pending += 2 * n
		case isStr(c) || isBin(c):
			if _, err := d.readBody(off, c); err != nil {
				return err
			}
		case c >= 0xc7 && c <= 0xc9 || c >= 0xd4 && c <= 0xd8:
			if err := d.skipExt(off, c); err != nil {
				return err
			}
		case c == 0xc1:
			return d.typeErr(off, c, "a msgpack value")
		default: // nil, bool, int, float: fixed size
			if err := d.dec.Skip(); err != nil {
				return d.ioErr(off, c, err)
			}
		}
	}
	return nil
}

// skipExt skips the ext value at off.
func (d *Decoder) skipExt(off int, c byte) error {
	p := d.payload[off:]
	var hdr, n int
	switch c {
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		hdr, n = 2, 1<<(c-0xd4)
	case 0xc7:
		hdr = 3
		if len(p) >= hdr {
			n = int(p[1])
		}
	case 0xc8:
		hdr = 4
		if len(p) >= hdr {
			n = int(binary.BigEndian.Uint16(p[1:]))
		}
	case 0xc9:
		hdr = 6
		if len(p) >= hdr {
			n = int(binary.BigEndian.Uint32(p[1:]))
		}
	}
	if len(p) < hdr || n < 0 || n > len(p)-hdr {
		return d.errorf(off, "ext value overruns the payload")
	}
	d.seek(off + hdr + n)
	return nil
}

// internMedium returns the medium names engines send without allocating.
func internMedium(s []byte) string {
	switch string(s) {
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "cpu":
		return "cpu"
	case "STORAGE":
		return "STORAGE"
	case "CPU_PINNED":
		return "CPU_PINNED"
	case "DISK":
		return "DISK"
	case "EXTERNAL":
		return "EXTERNAL"
	}
	return string(s)
}

// internSpecKind returns the common kv_cache_spec_kind values without
// allocating.
func internSpecKind(s []byte) string {
	switch string(s) {
	case "full_attention":
		return "full_attention"
	case "sliding_window":
		return "sliding_window"
	case "mamba":
		return "mamba"
	case "chunked_local_attention":
		return "chunked_local_attention"
	case "cross_attention":
		return "cross_attention"
	}
	return string(s)
}

func isInt(c byte) bool   { return c <= 0x7f || c >= 0xe0 || c >= 0xcc && c <= 0xd3 }
func isStr(c byte) bool   { return c >= 0xa0 && c <= 0xbf || c >= 0xd9 && c <= 0xdb }
func isBin(c byte) bool   { return c >= 0xc4 && c <= 0xc6 }
func isArray(c byte) bool { return c >= 0x90 && c <= 0x9f || c == 0xdc || c == 0xdd }
func isMap(c byte) bool   { return c >= 0x80 && c <= 0x8f || c == 0xde || c == 0xdf }

// codeName names the msgpack type family of a code for error messages.
func codeName(c byte) string {
	switch {
	case c <= 0x7f || c >= 0xe0 || c >= 0xd0 && c <= 0xd3:
		return "int"
	case c >= 0xcc && c <= 0xcf:
		return "uint"
	case isMap(c):
		return "map"
	case isArray(c):
		return "array"
	case isStr(c):
		return "str"
	case isBin(c):
		return "bin"
	case c == 0xc0:
		return "nil"
	case c == 0xc2 || c == 0xc3:
		return "bool"
	case c == 0xca:
		return "float32"
	case c == 0xcb:
		return "float64"
	case c == 0xc1:
		return "reserved code"
	}
	return "ext"
}

// resize returns s with length n, reusing its capacity when it can.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (d *Decoder) typeErr(off int, c byte, want string) error {
	return d.errorf(off, "want %s, got %s (0x%02x)", want, codeName(c), c)
}

// ioErr reports an error of the msgpack decoder reading the value at off;
// with the codes checked beforehand it can only be running out of bytes.
func (d *Decoder) ioErr(off int, c byte, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return d.errorf(off, "payload ends inside %s (0x%02x)", codeName(c), c)
	}
	return d.errorf(off, "%s (0x%02x): %v", codeName(c), c, err)
}

// errorf builds an error that wraps ErrMalformed and says where the decoder
// was and which bytes it was looking at.
func (d *Decoder) errorf(off int, format string, args ...any) error {
	var sb strings.Builder
	if d.event >= 0 {
		fmt.Fprintf(&sb, "event %d", d.event)
		if d.kind != 0 {
			fmt.Fprintf(&sb, " (%s)", d.kind)
		}
	} else {
		sb.WriteString("envelope")
	}
	switch {
	case d.field != "":
		sb.WriteString(" field ")
		sb.WriteString(d.field)
	case d.key != nil:
		k := d.key
		if len(k) > 40 {
			k = k[:40]
		}
		fmt.Fprintf(&sb, " field %q", k)
	}
	if d.index >= 0 {
		fmt.Fprintf(&sb, "[%d]", d.index)
	}
	if d.field == fieldNames[fExtraKeys] {
		for _, i := range d.path {
			fmt.Fprintf(&sb, "[%d]", i)
		}
	}
	sb.WriteString(": ")
	fmt.Fprintf(&sb, format, args...)
	fmt.Fprintf(&sb, " at offset %d: %s", off, snippet(d.payload, off))
	return fmt.Errorf("%w: %s", ErrMalformed, sb.String())
}

// snippet quotes up to 8 bytes either side of off in hex, the byte at off in
// brackets, in the spirit of nats-server quoting the bytes it choked on.
func snippet(p []byte, off int) string {
	const span = 8
	lo, hi := max(off-span, 0), min(off+span, len(p))
	var sb strings.Builder
	if lo > 0 {
		sb.WriteString("... ")
	}
	for i := lo; i < hi; i++ {
		if i > lo {
			sb.WriteByte(' ')
		}
		if i == off {
			fmt.Fprintf(&sb, "[%02x]", p[i])
		} else {
			fmt.Fprintf(&sb, "%02x", p[i])
		}
	}
	switch {
	case off >= len(p):
		if hi > lo {
			sb.WriteByte(' ')
		}
		sb.WriteString("[EOF]")
	case hi < len(p):
		sb.WriteString(" ...")
	}
	return sb.String()
}
