package fleet

import (
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

// The conversions cost a field copy per entry, against a NATS message per
// batch; a layout, rare (a group learned), a copy per group.
var (
	toWireOp = [...]events.DeltaOp{indexer.OpStore: events.DeltaStore, indexer.OpRemove: events.DeltaRemove, indexer.OpDrop: events.DeltaDrop, indexer.OpClear: events.DeltaClear}
	toIdxOp  = [...]indexer.DeltaOp{events.DeltaStore: indexer.OpStore, events.DeltaRemove: indexer.OpRemove, events.DeltaDrop: indexer.OpDrop, events.DeltaClear: indexer.OpClear}
)

// ToWire appends the effects an agent's index recorded (d) to w, side
// groups' included, and makes d's layout, when it has one, w's (as the
// agent publishes them; also for tools that publish recorded deltas
// through a natsbus.Agent without an engine).
func ToWire(d *indexer.Delta, w *events.Delta) {
	for i := range d.Entries {
		e := &d.Entries[i]
		w.Entries = append(w.Entries, events.DeltaEntry{
			Op: toWireOp[e.Op], Key: uint64(e.Key), Parent: uint64(e.Parent), HasParent: e.HasParent,
			Medium: e.Medium, Refs: e.Refs, BlockEdge: e.BlockEdge, MediumEdge: e.MediumEdge, Group: e.Group,
		})
	}
	if len(d.Layout) == 0 {
		return // unchanged
	}
	w.Layout = w.Layout[:0]
	for _, g := range d.Layout {
		w.Layout = append(w.Layout, events.KVGroup{Index: g.Index, Kind: g.Kind, BlockSize: g.BlockSize, Window: g.Window, Anchor: g.Anchor})
	}
}

// fromWire fills d from w with seq; a layout group's class follows from its
// kind and window, as the agent's index derived it.
func fromWire(w *events.Delta, seq uint64, d *indexer.Delta) {
	d.Reset()
	d.Seq = seq
	for i := range w.Entries {
		e := &w.Entries[i]
		op := indexer.DeltaOp(0)
		if int(e.Op) < len(toIdxOp) {
			op = toIdxOp[e.Op]
		}
		d.Entries = append(d.Entries, indexer.DeltaEntry{
			Op: op, Key: indexer.Key(e.Key), Parent: indexer.Key(e.Parent), HasParent: e.HasParent,
			Medium: e.Medium, Refs: e.Refs, BlockEdge: e.BlockEdge, MediumEdge: e.MediumEdge, Group: e.Group,
		})
	}
	for _, g := range w.Layout {
		d.Layout = append(d.Layout, indexer.Group{Index: g.Index, Kind: g.Kind, Class: indexer.ClassOfGroup(g.Kind, g.Window),
			BlockSize: g.BlockSize, Window: g.Window, Anchor: g.Anchor})
	}
}
