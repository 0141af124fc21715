package indexer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// segHead is what a segment says of its place in the whole.
type segHead struct {
	part               uint32
	seq                uint64 // snapshots only
	total, totalBlocks uint64 // totalBlocks: checkpoints only
	last               bool
	digest             uint64 // in the last segment
	keys, blocks       int
	state              bool // carries the worker's state (checkpoints: part 0 only)
	side               int  // side group items (see groupsync.go)
	totalSide          uint64
}

// segOrder checks that segments come in order and add up to what they say
// of the whole: Part from 0, one Last and nothing after it, one Seq and the
// same totals in every segment, at most maxKeys keys each, the state in
// part 0 only, and as many keys and blocks in all as the totals.
type segOrder struct {
	bad          error // ErrBadSnapshot or ErrBadCheckpoint
	what         string
	maxKeys      int
	first        segHead // segment 0's
	part         uint32  // the next segment's
	last         bool
	keys, blocks uint64 // in the segments so far
	side         uint64
}

// read calls each with every segment next returns, after checking its
// place, until io.EOF; then it checks the whole.
func read[S any](o *segOrder, next func() (*S, error), head func(*S) segHead, each func(*S) error) error {
	for {
		seg, err := next()
		if errors.Is(err, io.EOF) {
			return o.end()
		}
		if err != nil {
			return fmt.Errorf("reading %s segment %d: %w", o.what, o.part, err)
		}
		if seg == nil {
			return fmt.Errorf("%w: segment %d is nil", o.bad, o.part)
		}
		if err := o.add(head(seg)); err != nil {
			return err
		}
		if err := each(seg); err != nil {
			return err
		}
	}
}

// add checks the place of the next segment, whose head is h.
func (o *segOrder) add(h segHead) error {
	part := o.part
	switch {
	case o.last:
		return fmt.Errorf("%w: segment %d follows the last", o.bad, part)
	case h.part != part:
		return fmt.Errorf("%w: segment %d where segment %d belongs", o.bad, h.part, part)
	case part > 0 && h.seq != o.first.seq:
		return fmt.Errorf("%w: segment %d has seq %d, segment 0 seq %d", o.bad, part, h.seq, o.first.seq)
	case part > 0 && (h.total != o.first.total || h.totalBlocks != o.first.totalBlocks || h.totalSide != o.first.totalSide):
		return fmt.Errorf("%w: segment %d says %d keys, %d blocks and %d side items in all, segment 0 %d, %d and %d", o.bad, part, h.total, h.totalBlocks, h.totalSide, o.first.total, o.first.totalBlocks, o.first.totalSide)
	case h.side > o.maxKeys:
		return fmt.Errorf("%w: segment %d has %d side items, over %d", o.bad, part, h.side, o.maxKeys)
	case h.keys > o.maxKeys:
		return fmt.Errorf("%w: segment %d has %d keys, over %d", o.bad, part, h.keys, o.maxKeys)
	case part > 0 && h.state:
		return fmt.Errorf("%w: segment %d carries the worker's state, which belongs in segment 0", o.bad, part)
	}
	if part == 0 {
		o.first = h
	}
	o.keys += uint64(h.keys)
	o.blocks += uint64(h.blocks)
	o.side += uint64(h.side)
	if o.keys > o.first.total || o.blocks > o.first.totalBlocks || o.side > o.first.totalSide {
		return fmt.Errorf("%w: segment %d brings its keys, blocks or side items over the %d, %d and %d it says", o.bad, part, o.first.total, o.first.totalBlocks, o.first.totalSide)
	}
	o.part++
	if h.last {
		o.last = true
		o.first.digest = h.digest
	}
	return nil
}

// end checks that the last segment came and the totals were met.
func (o *segOrder) end() error {
	if !o.last {
		return fmt.Errorf("%w: it ends after %d segments, none of them the last", o.bad, o.part)
	}
	if o.keys != o.first.total || o.blocks != o.first.totalBlocks || o.side != o.first.totalSide {
		return fmt.Errorf("%w: %d keys, %d blocks and %d side items, its segments say %d, %d and %d", o.bad, o.keys, o.blocks, o.side, o.first.total, o.first.totalBlocks, o.first.totalSide)
	}
	return nil
}

// checkDigest checks the keys' digest against the last segment's.
func (o *segOrder) checkDigest(digest uint64) error {
	if digest != o.first.digest {
		return fmt.Errorf("%w: its keys' digest is %#016x, its last segment says %#016x", o.bad, digest, o.first.digest)
	}
	return nil
}

// Why a key does not fit where it comes.
const (
	whyTwice    = "the key comes twice"
	whyHoleLone = "it follows a placeholder but is not under it"
)

// whyParentLater says a key's parent has not come before it.
func whyParentLater(parent Key) string {
	return fmt.Sprintf("its parent %#016x is not before it", uint64(parent))
}

// keyOrder checks keys as they come and gives each its parent's index (-1
// at top level): no key twice, every parent before its key, every
// placeholder followed at once by a key under it, no placeholder last.
type keyOrder struct {
	index    map[Key]int32
	parent   []int32
	prev     Key
	prevHole bool
}

// restoreReserve bounds the keys a restore makes room for at once (the
// totals are the sender's word).
const restoreReserve = 1 << 20

func newKeyOrder(total uint64) keyOrder {
	n := int(min(total, restoreReserve))
	return keyOrder{index: make(map[Key]int32, n), parent: make([]int32, 0, n)}
}

// add checks the next key and returns why it does not fit, "" if it does.
func (o *keyOrder) add(k, parent Key, hasParent, hole bool) string {
	i := int32(len(o.parent))
	p := int32(-1)
	switch {
	case !hasParent:
	case i > 0 && o.prev == parent:
		p = i - 1
	default:
		pi, ok := o.index[parent]
		if !ok {
			return whyParentLater(parent)
		}
		p = pi
	}
	if i > 0 && o.prevHole && p != i-1 {
		return whyHoleLone
	}
	n := len(o.index)
	o.index[k] = i // one map operation: the length tells a new key
	if len(o.index) == n {
		return whyTwice
	}
	o.parent = append(o.parent, p)
	o.prev, o.prevHole = k, hole
	return ""
}

// end checks that the keys do not end with a placeholder, and their digest.
func (o *keyOrder) end(so *segOrder, digest uint64) error {
	if o.prevHole {
		return fmt.Errorf("%w: it ends with a placeholder (%#016x)", so.bad, uint64(o.prev))
	}
	return so.checkDigest(digest)
}

// keyPlacer places checked keys in order, each under the key its parent
// index names (-1: at the top), sizing each node it creates for the chain
// of keys from it.
type keyPlacer struct {
	parent   []int32
	locs     []loc
	chainEnd int
}

func newKeyPlacer(parent []int32) *keyPlacer {
	return &keyPlacer{parent: parent, locs: make([]loc, len(parent))}
}

// place places key i (set nil for a placeholder) through c, and returns
// its location and whether its node is new.
func (p *keyPlacer) place(c *cursor, i int, key Key, set *holders.Set) (loc, bool) {
	if i >= p.chainEnd {
		j := i + 1
		for j < len(p.parent) && p.parent[j] == int32(j-1) {
			j++
		}
		p.chainEnd = j
	}
	var l loc
	var fresh bool
	if q := p.parent[i]; q < 0 {
		l, fresh = c.top(key, set, p.chainEnd-i)
	} else {
		l, fresh = c.next(p.locs[q], key, set, p.chainEnd-i)
	}
	p.locs[i] = l
	return l, fresh
}

// Snapshot and checkpoint encodings share a key's tag byte: bits 0-1 say
// where it attaches (under the segment's previous key, at top level, or
// under the parent key that follows the key), bits 2-3 its form, which
// each encoding defines.
const (
	tagParentPrev = 0
	tagParentNone = 1
	tagParentKey  = 2
	tagParentMask = 3
	tagFormMask   = 3 << 2
)

// attachTag returns the attach bits of key i's tag; prev is the key before.
func attachTag(i int, prev, parent Key, hasParent bool) byte {
	switch {
	case !hasParent:
		return tagParentNone
	case i > 0 && prev == parent:
		return tagParentPrev
	}
	return tagParentKey
}

// appendKeyHead appends a key's tag, the key and, if the tag says so, its
// parent.
func appendKeyHead(b []byte, tag byte, k, parent Key) []byte {
	b = append(b, tag)
	b = binary.LittleEndian.AppendUint64(b, uint64(k))
	if tag&tagParentMask == tagParentKey {
		b = binary.LittleEndian.AppendUint64(b, uint64(parent))
	}
	return b
}

func appendLast(b []byte, last bool, digest uint64) []byte {
	if !last {
		return append(b, 0)
	}
	return binary.LittleEndian.AppendUint64(append(b, 1), digest)
}

// segDecoder reads a segment's encoding, remembering the first error.
type segDecoder struct {
	b   []byte
	off int
	err error
	bad error // the sentinel errors wrap
}

func (d *segDecoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: segment encoding at byte %d: %s", d.bad, d.off, fmt.Sprintf(format, args...))
	}
}

func (d *segDecoder) version(want byte) {
	if v := d.byte(); d.err == nil && v != want {
		d.fail("encoding version %d, want %d", v, want)
	}
}

func (d *segDecoder) last() (bool, uint64) {
	last := d.byte()
	if d.err == nil && last > 1 {
		d.fail("last flag %d", last)
	}
	if last != 1 {
		return false, 0
	}
	return true, d.uint64()
}

// keyHead reads key i's tag, the key and where it attaches, checking the
// tag's bits.
func (d *segDecoder) keyHead(i int, prev Key) (tag byte, k, parent Key, hasParent bool) {
	tag = d.byte()
	if d.err == nil && (tag&^(tagParentMask|tagFormMask) != 0 || tag&tagParentMask == 3 || tag&tagFormMask == 3<<2 ||
		tag&tagParentMask == tagParentPrev && i == 0) {
		d.fail("key %d: tag %#02x", i, tag)
	}
	k = Key(d.uint64())
	switch tag & tagParentMask {
	case tagParentPrev:
		parent, hasParent = prev, i > 0
	case tagParentKey:
		parent, hasParent = Key(d.uint64()), true
	}
	return tag, k, parent, hasParent
}

// end fails on bytes after the segment, and returns the first error.
func (d *segDecoder) end() error {
	if d.err == nil && len(d.b) > d.off {
		d.fail("%d bytes after the segment", len(d.b)-d.off)
	}
	return d.err
}

func (d *segDecoder) left() int { return len(d.b) - d.off }

// bytes reads n bytes, which alias the input.
func (d *segDecoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > d.left() {
		d.fail("truncated")
		return nil
	}
	d.off += n
	return d.b[d.off-n : d.off]
}

// varint reads a zig-zag varint in [lo, hi].
func (d *segDecoder) varint(lo, hi int64) int64 {
	u := d.uvarint(math.MaxUint64)
	v := int64(u>>1) ^ -int64(u&1)
	if v < lo || v > hi {
		d.fail("value %d outside [%d, %d]", v, lo, hi)
		return 0
	}
	return v
}

func (d *segDecoder) byte() byte {
	if b := d.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *segDecoder) uint64() uint64 {
	if b := d.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// uvarint reads a uvarint of at most max.
func (d *segDecoder) uvarint(max uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad or truncated varint")
		return 0
	}
	if v > max {
		d.fail("value %d over %d", v, max)
		return 0
	}
	d.off += n
	return v
}

func (d *segDecoder) media(i int) uint8 {
	m := d.byte()
	if d.err == nil && m >= 1<<events.NumMedia {
		d.fail("key %d: media %#02x", i, m)
	}
	return m
}
