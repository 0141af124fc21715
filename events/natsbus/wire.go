package natsbus

import (
	"errors"
	"fmt"

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
// allocation once grown; a chained store or a removal is 9 bytes on the wire.
func encodeDelta(m *fleetv1.Delta, h deltaHeader, d *events.Delta) {
	m.Epoch, m.Seq, m.EngineSeq, m.EngineTime = h.epoch, h.seq, h.engineSeq, h.engineTime
	m.Ops, m.Keys, m.Parents, m.Refs = m.Ops[:0], m.Keys[:0], m.Parents[:0], m.Refs[:0]
	m.Edges = m.Edges[:0]
	var prev uint64
	havePrev := false
	for i := range d.Entries {
		e := &d.Entries[i]
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

// unmarshalDelta decodes a Delta message into m, reusing m's slices.
func unmarshalDelta(b []byte, m *fleetv1.Delta) error {
	m.Ops, m.Keys, m.Parents, m.Refs, m.Edges = m.Ops[:0], m.Keys[:0], m.Parents[:0], m.Refs[:0], m.Edges[:0]
	m.Epoch, m.Seq, m.EngineSeq, m.EngineTime = 0, 0, 0, 0
	if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(b, m); err != nil {
		return fmt.Errorf("%w: delta: %w", ErrMalformed, err)
	}
	return nil
}
