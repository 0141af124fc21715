package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// refDecode is the differential oracle for Decoder: a second decoder that
// shares no code with decode.go. A general msgpack library
// (vmihailenco/msgpack) turns the payload into a tree of Go values, and
// refBatch builds the Batch from the tree following the wire spec
// (docs in decode.go, shared/spec/vllm-kvevents.md) rule by rule. It is
// slow and allocates freely; FuzzDecode checks that it and Decoder accept
// exactly the same payloads and decode them to the same Batch.
//
// It reports errRefTooDeep, and no verdict, for values nested deeper than
// it cares to recurse (the Decoder skips unknown values iteratively).
func refDecode(payload []byte) (*Batch, error) {
	r := bytes.NewReader(payload)
	d := msgpack.NewDecoder(r)
	tree, err := refValue(d, r, 0)
	if err != nil {
		return nil, err
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("ref: %d trailing bytes", r.Len())
	}
	return refBatch(tree)
}

var errRefTooDeep = errors.New("ref: nested too deep for the reference decoder")

// refPair is one key/value pair of a msgpack map; refMap keeps every pair
// in wire order, duplicates included, as the Decoder sees them.
type (
	refPair struct{ k, v any }
	refMap  []refPair
	refExt  struct{} // an ext value: valid msgpack, never a valid field
)

// refValue decodes one msgpack value into nil, bool, int8..int64,
// uint8..uint64, float32, float64, string, []byte, []any, refMap or refExt.
// r is d's reader, for the bytes left.
func refValue(d *msgpack.Decoder, r *bytes.Reader, depth int) (any, error) {
	if depth > 10000 {
		return nil, errRefTooDeep
	}
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		out := make([]any, 0, min(n, 64))
		for range n {
			v, err := refValue(d, r, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		out := make(refMap, 0, min(n, 64))
		for range n {
			k, err := refValue(d, r, depth+1)
			if err != nil {
				return nil, err
			}
			v, err := refValue(d, r, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, refPair{k, v})
		}
		return out, nil
	case msgpcode.IsExt(c):
		return refExt{}, d.Skip()
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		// DecodeInterface would allocate (and zero) a str or bin's
		// declared length before reading it, 4 GiB for a bin32 of
		// ff ff ff ff (found by FuzzDecode). Check it against what is left.
		n, err := d.DecodeBytesLen()
		if err != nil {
			return nil, err
		}
		if n > r.Len() {
			return nil, fmt.Errorf("ref: %d-byte str or bin, %d bytes left", n, r.Len())
		}
		buf := make([]byte, n)
		if err := d.ReadFull(buf); err != nil {
			return nil, err
		}
		if msgpcode.IsString(c) {
			return string(buf), nil
		}
		return buf, nil
	}
	return d.DecodeInterface() // scalars; the reserved code 0xc1 fails here
}

// refBatch builds a Batch from an envelope tree.
func refBatch(tree any) (*Batch, error) {
	b := &Batch{}
	var err error
	switch env := tree.(type) {
	case []any:
		if len(env) < 2 {
			return nil, fmt.Errorf("ref: envelope of %d elements", len(env))
		}
		if b.Timestamp, err = refFloat(env[0]); err != nil {
			return nil, err
		}
		if err = refEvents(b, env[1]); err != nil {
			return nil, err
		}
		if len(env) > 2 {
			if b.DPRank, b.HasDPRank, err = refRank(env[2]); err != nil {
				return nil, err
			}
		}
	case refMap:
		var seenTS, seenEvents bool
		for _, kv := range env {
			k, ok := kv.k.(string)
			if !ok {
				return nil, fmt.Errorf("ref: envelope key %T", kv.k)
			}
			switch k {
			case "ts":
				b.Timestamp, err = refFloat(kv.v)
				seenTS = true
			case "events":
				err = refEvents(b, kv.v)
				seenEvents = true
			case "data_parallel_rank":
				b.DPRank, b.HasDPRank, err = refRank(kv.v)
			}
			if err != nil {
				return nil, err
			}
		}
		if !seenTS || !seenEvents {
			return nil, errors.New("ref: envelope map without ts or events")
		}
	default:
		return nil, fmt.Errorf("ref: envelope %T", tree)
	}
	return b, nil
}

func refRank(v any) (int, bool, error) {
	if v == nil {
		return 0, false, nil
	}
	i, err := refIntIn(v, math.MinInt, math.MaxInt)
	return int(i), err == nil, err
}

// refEvents builds the events, leaving out (and counting in b) those whose
// tag is a str kvindex does not know.
func refEvents(b *Batch, v any) error {
	list, ok := v.([]any)
	if !ok {
		return fmt.Errorf("ref: events %T", v)
	}
	b.Events, b.UnknownEvents, b.UnknownTag = nil, 0, ""
	for i, ev := range list {
		var e Event
		tag, unknown, err := refEvent(&e, ev)
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if unknown {
			b.UnknownEvents++
			b.UnknownTag = tag[:min(len(tag), 40)]
			continue
		}
		b.Events = append(b.Events, e)
	}
	return nil
}

// refFieldsOf lists the fields of each kind, in array-era positional order.
var refFieldsOf = map[Kind][]string{
	KindBlockStored: {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
		"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"},
	KindBlockRemoved:     {"block_hashes", "medium", "group_idx"},
	KindAllBlocksCleared: {},
}

// refMapOnly lists the map-era keys of each kind that have no array-era
// position.
var refMapOnly = map[Kind][]string{
	KindBlockStored:  {"cache_salt", "metadata", "locality"},
	KindBlockRemoved: {"locality"},
}

// refEvent builds one event; for a well-formed event whose tag is a str
// kvindex does not know it returns the tag instead, e untouched.
func refEvent(e *Event, v any) (tag string, unknown bool, err error) {
	switch x := v.(type) {
	case []any:
		if len(x) == 0 {
			return "", false, errors.New("ref: empty event array")
		}
		k, tag, err := refTag(x[0])
		if err != nil || k == 0 {
			return tag, k == 0, err
		}
		e.Kind = k
		names := refFieldsOf[k]
		for i, val := range x[1:] {
			if i < len(names) {
				if err := refField(e, names[i], val); err != nil {
					return "", false, err
				}
			} // later positions: any value, ignored
		}
	case refMap:
		// Keys are strs up to the first "type", whose tag decides; an
		// unknown tag ends the checks.
		for _, kv := range x {
			name, ok := kv.k.(string)
			if !ok {
				return "", false, fmt.Errorf("ref: event key %T", kv.k)
			}
			if name != "type" {
				continue
			}
			k, tag, err := refTag(kv.v)
			if err != nil {
				return "", false, err
			}
			if e.Kind == 0 && k == 0 {
				return tag, true, nil
			}
			if e.Kind != 0 && e.Kind != k {
				return "", false, fmt.Errorf("ref: two tags %v and %v", e.Kind, k)
			}
			e.Kind = k
		}
		if e.Kind == 0 {
			return "", false, errors.New("ref: event map without type")
		}
		for _, kv := range x {
			name := kv.k.(string)
			if slices.Contains(refMapOnly[e.Kind], name) {
				if err := refField(e, name, kv.v); err != nil {
					return "", false, err
				}
			}
			for _, f := range refFieldsOf[e.Kind] {
				if f == name {
					if err := refField(e, name, kv.v); err != nil {
						return "", false, err
					}
				}
			}
		}
	default:
		return "", false, fmt.Errorf("ref: event %T", v)
	}
	if e.Kind == KindBlockStored && e.ExtraKeys != nil && len(e.ExtraKeys) != len(e.BlockHashes) {
		return "", false, errors.New("ref: extra_keys length differs from block_hashes")
	}
	if e.Locality == LocalityRemote {
		e.Medium = MediumExternal
	}
	return "", false, nil
}

// refTag returns a known tag's kind, or for another str the str itself.
func refTag(v any) (Kind, string, error) {
	s, ok := v.(string)
	if !ok {
		return 0, "", fmt.Errorf("ref: tag %T", v)
	}
	switch s {
	case "BlockStored":
		return KindBlockStored, "", nil
	case "BlockRemoved":
		return KindBlockRemoved, "", nil
	case "AllBlocksCleared":
		return KindAllBlocksCleared, "", nil
	}
	return 0, s, nil
}

// refField sets one field from its value; nil means the field's default.
func refField(e *Event, name string, v any) error {
	var err error
	switch name {
	case "block_hashes":
		e.BlockHashes = nil
		if v != nil {
			list, ok := v.([]any)
			if !ok {
				return fmt.Errorf("ref: block_hashes %T", v)
			}
			for _, h := range list {
				u, err := refHash(h)
				if err != nil {
					return err
				}
				e.BlockHashes = append(e.BlockHashes, u)
			}
		}
	case "parent_block_hash":
		e.ParentHash, e.HasParent = 0, false
		if v != nil {
			e.ParentHash, err = refHash(v)
			e.HasParent = true
		}
	case "token_ids":
		e.TokenIDs = nil
		if v != nil {
			list, ok := v.([]any)
			if !ok {
				return fmt.Errorf("ref: token_ids %T", v)
			}
			for _, t := range list {
				u, err := refIntIn(t, 0, math.MaxUint32)
				if err != nil {
					return err
				}
				e.TokenIDs = append(e.TokenIDs, uint32(u))
			}
		}
	case "block_size":
		e.BlockSize = 0
		if v != nil {
			var i int64
			i, err = refIntIn(v, math.MinInt, math.MaxInt)
			e.BlockSize = int(i)
		}
	case "lora_id":
		e.LoRAID, e.HasLoRAID = 0, false
		if v != nil {
			e.LoRAID, err = refIntIn(v, math.MinInt64, math.MaxInt64)
			e.HasLoRAID = true
		}
	case "medium":
		e.Medium, e.MediumName = MediumGPU, ""
		if v != nil {
			e.MediumName, err = refStr(v)
			e.Medium, _ = ParseMedium(e.MediumName)
		}
	case "lora_name":
		e.LoRAName = ""
		if m, ok := v.(refMap); ok { // SGLang's array-form metadata in lora_name's place
			return refMetadata(e, m)
		}
		if v != nil {
			e.LoRAName, err = refStr(v)
		}
	case "metadata":
		if v != nil {
			m, ok := v.(refMap)
			if !ok {
				return fmt.Errorf("ref: metadata %T", v)
			}
			return refMetadata(e, m)
		}
	case "extra_keys":
		e.ExtraKeys = nil
		if v != nil {
			list, ok := v.([]any)
			if !ok {
				return fmt.Errorf("ref: extra_keys %T", v)
			}
			e.ExtraKeys = []ExtraKeys{}
			for _, k := range list {
				if k == nil {
					e.ExtraKeys = append(e.ExtraKeys, nil)
					continue
				}
				if _, ok := k.([]any); !ok {
					return fmt.Errorf("ref: extra_keys entry %T", k)
				}
				buf, err := refExtra(nil, k, 0)
				if err != nil {
					return err
				}
				e.ExtraKeys = append(e.ExtraKeys, buf)
			}
		}
	case "group_idx":
		e.GroupIdx, e.HasGroupIdx = 0, false
		if v != nil {
			var i int64
			i, err = refIntIn(v, math.MinInt, math.MaxInt)
			e.GroupIdx, e.HasGroupIdx = int(i), true
		}
	case "kv_cache_spec_kind":
		e.SpecKind = ""
		if v != nil {
			e.SpecKind, err = refStr(v)
		}
	case "kv_cache_spec_sliding_window":
		e.SlidingWindow, e.HasSlidingWindow = 0, false
		if v != nil {
			var i int64
			i, err = refIntIn(v, math.MinInt, math.MaxInt)
			e.SlidingWindow, e.HasSlidingWindow = int(i), true
		}
	case "cache_salt":
		e.CacheSalt = ""
		if v != nil {
			e.CacheSalt, err = refStr(v)
		}
	case "locality":
		e.Locality = LocalityLocal
		if v != nil {
			var s string
			if s, err = refStr(v); err == nil {
				e.Locality, _ = ParseLocality(s)
			}
		}
	}
	return err
}

// refMetadata reads SGLang's BlockStoredMetadata: string keys, cache_salt
// a string or nil, other keys ignored.
func refMetadata(e *Event, m refMap) error {
	for _, kv := range m {
		k, ok := kv.k.(string)
		if !ok {
			return fmt.Errorf("ref: metadata key %T", kv.k)
		}
		if k != "cache_salt" {
			continue
		}
		e.CacheSalt = ""
		if kv.v != nil {
			s, err := refStr(kv.v)
			if err != nil {
				return err
			}
			e.CacheSalt = s
		}
	}
	return nil
}

// refInt returns an integer's 64-bit two's complement and whether it is
// negative; ok is false for a non-integer.
func refInt(v any) (u uint64, neg, ok bool) {
	switch x := v.(type) {
	case int8:
		return uint64(int64(x)), x < 0, true
	case int16:
		return uint64(int64(x)), x < 0, true
	case int32:
		return uint64(int64(x)), x < 0, true
	case int64:
		return uint64(x), x < 0, true
	case uint8:
		return uint64(x), false, true
	case uint16:
		return uint64(x), false, true
	case uint32:
		return uint64(x), false, true
	case uint64:
		return x, false, true
	}
	return 0, false, false
}

func refIntIn(v any, lo, hi int64) (int64, error) {
	u, neg, ok := refInt(v)
	switch {
	case !ok:
		return 0, fmt.Errorf("ref: want integer, got %T", v)
	case neg && int64(u) < lo, !neg && u > uint64(hi):
		return 0, fmt.Errorf("ref: integer out of range")
	}
	return int64(u), nil
}

func refFloat(v any) (float64, error) {
	switch x := v.(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	}
	u, neg, ok := refInt(v)
	switch {
	case !ok:
		return 0, fmt.Errorf("ref: want float, got %T", v)
	case neg:
		return float64(int64(u)), nil
	}
	return float64(u), nil
}

func refStr(v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("ref: want str, got %T", v)
	}
	return s, nil
}

func refHash(v any) (uint64, error) {
	if b, ok := v.([]byte); ok {
		if len(b) < 8 {
			return 0, errors.New("ref: short bin hash")
		}
		return binary.BigEndian.Uint64(b[len(b)-8:]), nil
	}
	u, _, ok := refInt(v)
	if !ok {
		return 0, fmt.Errorf("ref: hash %T", v)
	}
	return u, nil
}

// refExtra appends the canonical form of an extra_keys value at depth
// (a block's tuple is depth 0).
func refExtra(dst []byte, v any, depth int) ([]byte, error) {
	if depth > maxExtraDepth {
		return nil, errors.New("ref: extra keys too deep")
	}
	switch x := v.(type) {
	case nil:
		return AppendNone(dst), nil
	case bool:
		return AppendBool(dst, x), nil
	case float32:
		return AppendFloat(dst, float64(x)), nil
	case float64:
		return AppendFloat(dst, x), nil
	case string:
		return AppendString(dst, x), nil
	case []byte:
		return AppendBytes(dst, x), nil
	case []any:
		dst = AppendTuple(dst, len(x))
		for _, e := range x {
			var err error
			if dst, err = refExtra(dst, e, depth+1); err != nil {
				return nil, err
			}
		}
		return dst, nil
	}
	if u, neg, ok := refInt(v); ok {
		if neg {
			return AppendInt(dst, int64(u)), nil
		}
		return AppendUint(dst, u), nil
	}
	return nil, fmt.Errorf("ref: extra key value %T", v)
}

// TestRefDecodeKnownAnswers checks the oracle itself against the answers
// written out by hand: it must decode the fixtures and spec vectors to the
// expected batches and reject every malformed vector and truncation.
func TestRefDecodeKnownAnswers(t *testing.T) {
	for _, name := range payloadFixtureFiles {
		for _, m := range loadPayloadFixture(t, name).Messages {
			p := hexBytes(t, m.PayloadHex)
			got, err := refDecode(p)
			if err != nil {
				t.Fatalf("%s seq %d: %v", name, m.Seq, err)
			}
			if d := diffBatch(got, jsonBatch(t, parseJSON(t, m.Decoded))); d != "" {
				t.Errorf("%s seq %d: %s", name, m.Seq, d)
			}
			for n := range len(p) {
				if _, err := refDecode(p[:n]); err == nil {
					t.Errorf("%s seq %d cut to %d bytes: accepted", name, m.Seq, n)
				}
			}
		}
	}
	for _, v := range specVectors {
		got, err := refDecode(hx(v.hex))
		if err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		if d := diffBatch(got, &v.want); d != "" {
			t.Errorf("%s: %s", v.name, d)
		}
	}
	for _, m := range malformedVectors {
		if _, err := refDecode(hx(m.hex)); err == nil {
			t.Errorf("%s: accepted", m.name)
		}
	}
}
