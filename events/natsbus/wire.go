package natsbus

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/events"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

// ErrMalformed reports a fleet message that does not decode or whose
// columns disagree (see fleetv1.Delta).
var ErrMalformed = errors.New("nats: malformed fleet message")

// The bits of a Delta's ops byte (fleetv1.Delta's doc).
const (
	opMask        = 0x07
	mediumShift   = 3
	mediumMask    = 0x07 << mediumShift
	hasParentBit  = 1 << 6
	parentPrevBit = 1 << 7
)

// deltaHeader is a Delta's fields other than its entries.
type deltaHeader struct {
	epoch, seq, engineSeq uint64
	engineTime            float64
}

// encodeDelta fills m with d and h, reusing m's slices. Cost: O(entries), no
// allocation once grown; a chained store or a removal is 9 bytes on the wire,
// 10 in a delta with a side group's entry (the groups column), and a layout
// allocates a message a group.
func encodeDelta(m *fleetv1.Delta, h deltaHeader, d *events.Delta) {
	m.Epoch, m.Seq, m.EngineSeq, m.EngineTime = h.epoch, h.seq, h.engineSeq, h.engineTime
	m.Ops, m.Keys, m.Parents, m.Refs = m.Ops[:0], m.Keys[:0], m.Parents[:0], m.Refs[:0]
	m.Edges, m.Groups, m.Layout = m.Edges[:0], m.Groups[:0], m.Layout[:0]
	for _, g := range d.Layout {
		m.Layout = append(m.Layout, &fleetv1.KVCacheGroup{Index: uint32(g.Index), Kind: g.Kind,
			BlockSize: uint32(g.BlockSize), SlidingWindow: uint32(g.Window), Anchor: g.Anchor})
	}
	var prev uint64
	havePrev := false
	for i := range d.Entries {
		e := &d.Entries[i]
		if e.Group != 0 && len(m.Groups) == 0 {
			// The first side entry: the column starts, zeros before it.
			m.Groups = slices.Grow(m.Groups, len(d.Entries))[:i]
			clear(m.Groups)
		}
		if e.Group != 0 || len(m.Groups) > 0 {
			m.Groups = append(m.Groups, e.Group)
		}
		if i%4 == 0 {
			m.Edges = append(m.Edges, 0)
		}
		var edge byte
		if e.BlockEdge {
			edge |= 1
		}
		if e.MediumEdge {
			edge |= 2
		}
		m.Edges[len(m.Edges)-1] |= edge << (2 * (i % 4))
		op := byte(e.Op) | byte(e.Medium)<<mediumShift&mediumMask
		switch e.Op {
		case events.DeltaStore:
			if e.HasParent {
				op |= hasParentBit
				if havePrev && e.Parent == prev {
					op |= parentPrevBit
				} else {
					m.Parents = append(m.Parents, e.Parent)
				}
			}
		case events.DeltaDrop:
			m.Refs = append(m.Refs, e.Refs[:]...)
		}
		m.Ops = append(m.Ops, op)
		if e.Op != events.DeltaClear {
			m.Keys = append(m.Keys, e.Key)
			prev, havePrev = e.Key, true
		} else {
			havePrev = false
		}
	}
}

// decodeDelta fills d from m, checking that the columns agree.
func decodeDelta(m *fleetv1.Delta, d *events.Delta) error {
	d.Reset()
	if want := (len(m.Ops) + 3) / 4; len(m.Edges) != want {
		return fmt.Errorf("%w: %d edge bytes for %d entries, want %d", ErrMalformed, len(m.Edges), len(m.Ops), want)
	}
	if len(m.Groups) != 0 && len(m.Groups) != len(m.Ops) {
		return fmt.Errorf("%w: %d group bytes for %d entries", ErrMalformed, len(m.Groups), len(m.Ops))
	}
	if err := decodeLayout(m.Layout, d); err != nil {
		return err
	}
	ki, pi, ri := 0, 0, 0
	var prev uint64
	havePrev := false
	for i, op := range m.Ops {
		edge := m.Edges[i/4] >> (2 * (i % 4))
		e := events.DeltaEntry{Op: events.DeltaOp(op & opMask), Medium: events.Medium((op & mediumMask) >> mediumShift), BlockEdge: edge&1 != 0, MediumEdge: edge&2 != 0}
		if e.Op < events.DeltaStore || e.Op > events.DeltaClear {
			return fmt.Errorf("%w: entry %d: op %d", ErrMalformed, i, op&opMask)
		}
		if int(e.Medium) >= events.NumMedia {
			return fmt.Errorf("%w: entry %d: medium %d", ErrMalformed, i, e.Medium)
		}
		if e.Op != events.DeltaStore && op&(hasParentBit|parentPrevBit) != 0 {
			return fmt.Errorf("%w: entry %d: a %s with parent bits", ErrMalformed, i, e.Op)
		}
		if len(m.Groups) > 0 && m.Groups[i] != 0 {
			e.Group = m.Groups[i]
			if e.Op != events.DeltaStore && e.Op != events.DeltaRemove || op&(hasParentBit|parentPrevBit) != 0 {
				return fmt.Errorf("%w: entry %d: a %s (op byte %#02x) of side group %d: only stores without a parent and removals name one", ErrMalformed, i, e.Op, op, e.Group-1)
			}
		}
		if e.Op == events.DeltaClear {
			d.Entries = append(d.Entries, e)
			havePrev = false
			continue
		}
		if ki >= len(m.Keys) {
			return fmt.Errorf("%w: entry %d: %d keys for more entries", ErrMalformed, i, len(m.Keys))
		}
		e.Key = m.Keys[ki]
		ki++
		switch {
		case op&parentPrevBit != 0:
			if op&hasParentBit == 0 || !havePrev {
				return fmt.Errorf("%w: entry %d: parent is the previous key, but there is none", ErrMalformed, i)
			}
			e.Parent, e.HasParent = prev, true
		case op&hasParentBit != 0:
			if pi >= len(m.Parents) {
				return fmt.Errorf("%w: entry %d: %d parents for more stores", ErrMalformed, i, len(m.Parents))
			}
			e.Parent, e.HasParent = m.Parents[pi], true
			pi++
		}
		if e.Op == events.DeltaDrop {
			if ri+events.NumMedia > len(m.Refs) {
				return fmt.Errorf("%w: entry %d: refs for %d drops, more drops", ErrMalformed, i, len(m.Refs)/events.NumMedia)
			}
			copy(e.Refs[:], m.Refs[ri:ri+events.NumMedia])
			ri += events.NumMedia
		}
		d.Entries = append(d.Entries, e)
		prev, havePrev = e.Key, true
	}
	if ki != len(m.Keys) || pi != len(m.Parents) || ri != len(m.Refs) {
		return fmt.Errorf("%w: %d entries leave %d keys, %d parents and %d ref bytes unused", ErrMalformed, len(m.Ops), len(m.Keys)-ki, len(m.Parents)-pi, len(m.Refs)-ri)
	}
	return nil
}

// decodeLayout fills d.Layout from l, checking that its groups' indices
// ascend and that the groups column can name them (below 255); whether
// the groups make a layout a worker can have is the index's to check.
func decodeLayout(l []*fleetv1.KVCacheGroup, d *events.Delta) error {
	for i, g := range l {
		switch {
		case g.GetIndex() > math.MaxUint8-1:
			return fmt.Errorf("%w: layout group %d: index %d past %d", ErrMalformed, i, g.GetIndex(), math.MaxUint8-1)
		case i > 0 && g.GetIndex() <= l[i-1].GetIndex():
			return fmt.Errorf("%w: layout group %d: index %d after %d", ErrMalformed, i, g.GetIndex(), l[i-1].GetIndex())
		case g.GetBlockSize() > math.MaxInt32 || g.GetSlidingWindow() > math.MaxInt32:
			return fmt.Errorf("%w: layout group %d: block size %d, window %d", ErrMalformed, i, g.GetBlockSize(), g.GetSlidingWindow())
		}
		d.Layout = append(d.Layout, events.KVGroup{Index: int(g.GetIndex()), Kind: g.GetKind(),
			BlockSize: int(g.GetBlockSize()), Window: int(g.GetSlidingWindow()), Anchor: g.GetAnchor()})
	}
	return nil
}

// unmarshalDelta decodes a Delta message into m, reusing m's slices (a
// layout's messages are new).
func unmarshalDelta(b []byte, m *fleetv1.Delta) error {
	m.Ops, m.Keys, m.Parents, m.Refs, m.Edges = m.Ops[:0], m.Keys[:0], m.Parents[:0], m.Refs[:0], m.Edges[:0]
	m.Groups, m.Layout = m.Groups[:0], m.Layout[:0]
	m.Epoch, m.Seq, m.EngineSeq, m.EngineTime = 0, 0, 0, 0
	if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(b, m); err != nil {
		return fmt.Errorf("%w: delta: %w", ErrMalformed, err)
	}
	return nil
}
