package events

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ExtraKeys is one block's extra hash inputs (vLLM's extra_keys tuple: LoRA
// name, multimodal ids, cache_salt, ...) canonically encoded, so that equal
// Python values give equal bytes whatever msgpack types carried them; nil is
// None. A tag byte per value:
//
//	't' uvarint(n) value*n   tuple / list
//	's' uvarint(len) bytes   string
//	'b' uvarint(len) bytes   bytes
//	'i' 8 bytes BE           integer in int64 range
//	'u' 8 bytes BE           integer above the int64 range
//	'f' 8 bytes BE           float64 bits
//	'T' | 'F'                bool
//	'n'                      None
//
// A block's ExtraKeys is one tuple: build it with AppendTuple and Append*,
// read it with Values or String.
type ExtraKeys []byte

// ErrExtraKeys reports a malformed canonical extra-keys encoding.
var ErrExtraKeys = errors.New("events: malformed extra keys")

// AppendTuple starts a tuple of n values; append exactly n values after it.
func AppendTuple(dst []byte, n int) []byte {
	return binary.AppendUvarint(append(dst, 't'), uint64(n))
}

// AppendString appends a string value.
func AppendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(append(dst, 's'), uint64(len(s)))
	return append(dst, s...)
}

// AppendBytes appends a bytes value.
func AppendBytes(dst []byte, b []byte) []byte {
	dst = binary.AppendUvarint(append(dst, 'b'), uint64(len(b)))
	return append(dst, b...)
}

// AppendInt appends an integer value.
func AppendInt(dst []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 'i'), uint64(v))
}

// AppendUint appends an integer value; values that fit int64 as AppendInt.
func AppendUint(dst []byte, v uint64) []byte {
	if v <= math.MaxInt64 {
		return AppendInt(dst, int64(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 'u'), v)
}

// AppendFloat appends a float value.
func AppendFloat(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 'f'), math.Float64bits(f))
}

// AppendBool appends a bool value.
func AppendBool(dst []byte, v bool) []byte {
	if v {
		return append(dst, 'T')
	}
	return append(dst, 'F')
}

// AppendNone appends Python's None.
func AppendNone(dst []byte) []byte { return append(dst, 'n') }

// Values decodes the extra keys into string, []byte, int64, uint64, float64,
// bool, nil and []any (tuples), for tests and debugging output.
func (e ExtraKeys) Values() ([]any, error) {
	if e == nil {
		return nil, nil
	}
	v, rest, err := decodeExtra(e, 0)
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrExtraKeys, len(rest))
	}
	t, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: top level is %T, want a tuple", ErrExtraKeys, v)
	}
	return t, nil
}

// String renders the keys as a Python literal, ('my-lora', ('mm-A', 0)), or None.
func (e ExtraKeys) String() string {
	if e == nil {
		return "None"
	}
	v, _, err := decodeExtra(e, 0)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	var sb strings.Builder
	writePy(&sb, v)
	return sb.String()
}

const maxExtraDepth = 32

func decodeExtra(b []byte, depth int) (any, []byte, error) {
	if depth > maxExtraDepth {
		return nil, nil, fmt.Errorf("%w: nested deeper than %d", ErrExtraKeys, maxExtraDepth)
	}
	if len(b) == 0 {
		return nil, nil, fmt.Errorf("%w: truncated", ErrExtraKeys)
	}
	tag, b := b[0], b[1:]
	switch tag {
	case 'n':
		return nil, b, nil
	case 'T':
		return true, b, nil
	case 'F':
		return false, b, nil
	case 'i', 'u', 'f':
		if len(b) < 8 {
			return nil, nil, fmt.Errorf("%w: truncated number", ErrExtraKeys)
		}
		u := binary.BigEndian.Uint64(b)
		switch tag {
		case 'i':
			return int64(u), b[8:], nil
		case 'u':
			return u, b[8:], nil
		}
		return math.Float64frombits(u), b[8:], nil
	case 's', 'b':
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, nil, fmt.Errorf("%w: bad length", ErrExtraKeys)
		}
		raw := b[k : k+int(n)]
		if tag == 's' {
			return string(raw), b[k+int(n):], nil
		}
		return append([]byte(nil), raw...), b[k+int(n):], nil
	case 't':
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, nil, fmt.Errorf("%w: bad tuple length", ErrExtraKeys)
		}
		b = b[k:]
		out := make([]any, 0, n)
		for i := uint64(0); i < n; i++ {
			var v any
			var err error
			v, b, err = decodeExtra(b, depth+1)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, v)
		}
		return out, b, nil
	}
	return nil, nil, fmt.Errorf("%w: unknown tag 0x%02x", ErrExtraKeys, tag)
}

func writePy(sb *strings.Builder, v any) {
	switch x := v.(type) {
	case nil:
		sb.WriteString("None")
	case bool:
		if x {
			sb.WriteString("True")
		} else {
			sb.WriteString("False")
		}
	case string:
		sb.WriteString(strconv.Quote(x))
	case []byte:
		sb.WriteString("b" + strconv.Quote(string(x)))
	case int64:
		sb.WriteString(strconv.FormatInt(x, 10))
	case uint64:
		sb.WriteString(strconv.FormatUint(x, 10))
	case float64:
		sb.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
	case []any:
		sb.WriteByte('(')
		for i, e := range x {
			if i > 0 {
				sb.WriteString(", ")
			}
			writePy(sb, e)
		}
		if len(x) == 1 {
			sb.WriteByte(',')
		}
		sb.WriteByte(')')
	}
}

// decodeExtraKeys decodes extra_keys (nil, or per block nil or a tuple),
// reusing the event's old buffers.
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
		off := d.pos
		c, err := d.peek(off)
		if err != nil {
			return err
		}
		switch {
		case c == 0xc0:
			d.pos++
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

// appendExtraValue appends the canonical encoding of the next value, at
// nesting depth depth (a block's tuple is 0).
func (d *Decoder) appendExtraValue(dst []byte, depth int) ([]byte, error) {
	off := d.pos
	if depth > maxExtraDepth {
		return dst, d.errorf(off, "extra keys nested deeper than %d", maxExtraDepth)
	}
	c, err := d.peek(off)
	if err != nil {
		return dst, err
	}
	switch {
	case c == 0xc0:
		d.pos++
		return AppendNone(dst), nil
	case c == 0xc2 || c == 0xc3:
		d.pos++
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
		f, err := d.readRawFloat(off, c)
		if err != nil {
			return dst, err
		}
		return AppendFloat(dst, f), nil
	case isStr(c):
		s, err := d.readBody(off, c)
		if err != nil {
			return dst, err
		}
		return appendExtraString(dst, s), nil
	case isBin(c):
		b, err := d.readBody(off, c)
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
