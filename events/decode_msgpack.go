package events

import (
	"encoding/binary"
	"math"
)

// Each read* method reads the value at d.pos and advances past it (on error
// d.pos is anywhere). Methods taking off and c expect d.pos == off and
// c == d.p[off].

// readTokens reads len(t) token ids. Fixints and uint8/16/32 (msgspec's
// forms) are read inline, the unsigned ones without a branch on the width
// (a switch mispredicts mixed uint16/uint32 ids): load 4 bytes after the code
// and shift off the unused ones. Anything else goes through readInt.
// Cost: ~2 ns per token, no allocation.
func (d *Decoder) readTokens(t []uint32) error {
	p, pos := d.p, d.pos
	for i := range t {
		if pos+5 <= len(p) {
			c := p[pos]
			if c-0xcc <= 0xce-0xcc { // uint8, uint16, uint32
				w := c & 3 // log2 of the width in bytes: 0, 1, 2
				t[i] = binary.BigEndian.Uint32(p[pos+1:pos+5]) >> (32 - 8<<w)
				pos += 1 + 1<<w
				continue
			}
			if c <= 0x7f {
				t[i] = uint32(c)
				pos++
				continue
			}
		} else if pos < len(p) && p[pos] <= 0x7f {
			t[i] = uint32(p[pos])
			pos++
			continue
		}
		d.pos, d.index = pos, i
		v, err := d.readInt(0, math.MaxUint32)
		if err != nil {
			return err
		}
		t[i] = uint32(v)
		pos = d.pos
	}
	d.pos, d.index = pos, -1
	return nil
}

// readHashes reads len(h) block hashes; uint64 (vLLM's usual form) inline.
func (d *Decoder) readHashes(h []uint64) error {
	p, pos := d.p, d.pos
	for i := range h {
		if pos+9 <= len(p) && p[pos] == 0xcf {
			h[i] = binary.BigEndian.Uint64(p[pos+1 : pos+9])
			pos += 9
			continue
		}
		d.pos, d.index = pos, i
		v, err := d.readHash()
		if err != nil {
			return err
		}
		h[i] = v
		pos = d.pos
	}
	d.pos, d.index = pos, -1
	return nil
}

// peek returns the code at off (== d.pos) without consuming it.
func (d *Decoder) peek(off int) (byte, error) {
	if off >= len(d.p) {
		return 0, d.errorf(off, "unexpected end of payload")
	}
	return d.p[off], nil
}

// takeNil consumes a nil if one is next (small enough to inline).
func (d *Decoder) takeNil() (bool, error) {
	if d.pos >= len(d.p) {
		return false, d.errorf(d.pos, "unexpected end of payload")
	}
	if d.p[d.pos] != 0xc0 {
		return false, nil
	}
	d.pos++
	return true, nil
}

// readHash reads an integer block hash (as 64-bit two's complement), or a
// bin of at least 8 bytes folded to its last 8 big-endian, as vLLM folds.
func (d *Decoder) readHash() (uint64, error) {
	off := d.pos
	c, err := d.peek(off)
	if err != nil {
		return 0, err
	}
	switch {
	case isInt(c):
		v, _, err := d.readRawInt(off, c)
		return v, err
	case isBin(c):
		b, err := d.readBody(off, c)
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
	off := d.pos
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

// readRawInt reads the integer at off as 64-bit two's complement and
// whether it is negative (unsigned forms keep values >= 2^63).
func (d *Decoder) readRawInt(off int, c byte) (uint64, bool, error) {
	switch {
	case c <= 0x7f: // positive fixint
		d.pos = off + 1
		return uint64(c), false, nil
	case c >= 0xe0: // negative fixint
		d.pos = off + 1
		return uint64(int64(int8(c))), true, nil
	}
	// 0xcc..0xcf uint8..64, 0xd0..0xd3 int8..64: low two bits give the width.
	size := 1 << (c & 3)
	end := off + 1 + size
	if end > len(d.p) {
		return 0, false, d.truncated(off, c)
	}
	b := d.p[off+1 : end]
	var u uint64
	switch size {
	case 1:
		u = uint64(b[0])
	case 2:
		u = uint64(binary.BigEndian.Uint16(b))
	case 4:
		u = uint64(binary.BigEndian.Uint32(b))
	default:
		u = binary.BigEndian.Uint64(b)
	}
	d.pos = end
	if c <= 0xcf {
		return u, false, nil
	}
	shift := 64 - 8*size // sign-extend the signed forms
	v := int64(u<<shift) >> shift
	return uint64(v), v < 0, nil
}

// readFloat reads a float32, float64 or integer as float64.
func (d *Decoder) readFloat() (float64, error) {
	off := d.pos
	c, err := d.peek(off)
	if err != nil {
		return 0, err
	}
	switch {
	case c == 0xca || c == 0xcb:
		return d.readRawFloat(off, c)
	case isInt(c):
		v, neg, err := d.readRawInt(off, c)
		if neg {
			return float64(int64(v)), err
		}
		return float64(v), err
	}
	return 0, d.typeErr(off, c, "float")
}

// readRawFloat reads the float32 (0xca) or float64 (0xcb) at off.
func (d *Decoder) readRawFloat(off int, c byte) (float64, error) {
	size := 8
	if c == 0xca {
		size = 4
	}
	end := off + 1 + size
	if end > len(d.p) {
		return 0, d.truncated(off, c)
	}
	d.pos = end
	if size == 4 {
		return float64(math.Float32frombits(binary.BigEndian.Uint32(d.p[off+1 : end]))), nil
	}
	return math.Float64frombits(binary.BigEndian.Uint64(d.p[off+1 : end])), nil
}

// readStr reads a str aliasing the payload; fixstrs (keys, tags, media)
// without further calls.
func (d *Decoder) readStr() ([]byte, error) {
	off, p := d.pos, d.p
	if off < len(p) && p[off]&0xe0 == 0xa0 { // fixstr
		start := off + 1
		if end := start + int(p[off]&0x1f); end <= len(p) {
			d.pos = end
			return p[start:end:end], nil
		}
	}
	c, err := d.peek(off)
	if err != nil {
		return nil, err
	}
	if !isStr(c) {
		return nil, d.typeErr(off, c, "str")
	}
	return d.readBody(off, c)
}

// readBody returns the body of the str or bin at off as a slice of the
// payload, capacity clipped so that an append cannot write into it.
func (d *Decoder) readBody(off int, c byte) ([]byte, error) {
	var n, hdr int
	p := d.p
	switch {
	case c >= 0xa0 && c <= 0xbf: // fixstr
		n, hdr = int(c&0x1f), 1
	case c == 0xd9 || c == 0xc4: // str8, bin8
		hdr = 2
		if off+hdr <= len(p) {
			n = int(p[off+1])
		}
	case c == 0xda || c == 0xc5: // str16, bin16
		hdr = 3
		if off+hdr <= len(p) {
			n = int(binary.BigEndian.Uint16(p[off+1 : off+3]))
		}
	default: // str32, bin32
		hdr = 5
		if off+hdr <= len(p) {
			n = int(binary.BigEndian.Uint32(p[off+1 : off+5]))
		}
	}
	pos := off + hdr
	if pos > len(p) {
		return nil, d.truncated(off, c)
	}
	if n > len(p)-pos {
		return nil, d.errorf(off, "%s of %d bytes overruns the payload (%d bytes left)", codeName(c), uint32(n), len(p)-pos)
	}
	d.pos = pos + n
	return p[pos : pos+n : pos+n], nil
}

// readArrayLen reads an array header of elements of at least minElem bytes.
func (d *Decoder) readArrayLen(minElem int) (int, error) {
	off, p := d.pos, d.p
	if off < len(p) && p[off]&0xf0 == 0x90 { // fixarray
		if n := int(p[off] & 0x0f); n <= (len(p)-off-1)/minElem {
			d.pos = off + 1
			return n, nil
		}
	}
	c, err := d.peek(off)
	if err != nil {
		return 0, err
	}
	if !isArray(c) {
		return 0, d.typeErr(off, c, "array")
	}
	return d.arrayLen(off, c, minElem)
}

// arrayLen reads the array header at off and checks that its elements of at
// least minElem bytes fit in what is left: no length prefix can make the
// decoder allocate more than the payload holds.
func (d *Decoder) arrayLen(off int, c byte, minElem int) (int, error) {
	n, err := d.containerLen(off, c, 0xdc)
	if err != nil {
		return 0, err
	}
	if left := len(d.p) - d.pos; n > left/minElem {
		if minElem > 1 {
			return 0, d.errorf(off, "array of %d elements of at least %d bytes each cannot fit in the %d bytes left",
				uint32(n), minElem, left)
		}
		return 0, d.errorf(off, "array of %d elements cannot fit in the %d bytes left", uint32(n), left)
	}
	return n, nil
}

// mapLen reads the map header at off, checking that its pairs fit.
func (d *Decoder) mapLen(off int, c byte) (int, error) {
	n, err := d.containerLen(off, c, 0xde)
	if err != nil {
		return 0, err
	}
	if left := len(d.p) - d.pos; n > left/2 {
		return 0, d.errorf(off, "map of %d pairs cannot fit in the %d bytes left", uint32(n), left)
	}
	return n, nil
}

// containerLen reads the count of the array or map header at off: fix forms
// in the low 4 bits, code16 (0xdc, 0xde) and code16+1 big-endian.
func (d *Decoder) containerLen(off int, c, code16 byte) (int, error) {
	p := d.p
	switch c {
	case code16:
		if off+3 > len(p) {
			return 0, d.truncated(off, c)
		}
		d.pos = off + 3
		return int(binary.BigEndian.Uint16(p[off+1 : off+3])), nil
	case code16 + 1:
		if off+5 > len(p) {
			return 0, d.truncated(off, c)
		}
		d.pos = off + 5
		return int(binary.BigEndian.Uint32(p[off+1 : off+5])), nil
	}
	d.pos = off + 1
	return int(c & 0x0f), nil
}

// skip skips one value, iteratively, so that nesting cannot exhaust the stack.
func (d *Decoder) skip() error {
	for pending := 1; pending > 0; {
		pending--
		off := d.pos
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
			if n > len(d.p)-d.pos-pending {
				return d.errorf(off, "array of %d elements cannot fit in the bytes left", n)
			}
			pending += n
		case isMap(c):
			n, err := d.mapLen(off, c)
			if err != nil {
				return err
			}
			if 2*n > len(d.p)-d.pos-pending {
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
			end := off + fixedSize(c)
			if end > len(d.p) {
				return d.truncated(off, c)
			}
			d.pos = end
		}
	}
	return nil
}

// fixedSize is the encoded size of a nil, bool, int or float whose code is c.
func fixedSize(c byte) int {
	switch c {
	case 0xca:
		return 5
	case 0xcb:
		return 9
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return 1 + 1<<(c&3)
	}
	return 1 // fixints, nil, bool
}

// skipExt skips the ext value at off.
func (d *Decoder) skipExt(off int, c byte) error {
	p := d.p[off:]
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
	d.pos = off + hdr + n
	return nil
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

// resize returns s with length n, reusing its capacity.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
