package events

// The keyed model: what an agent (a sidecar beside one engine pod) tells
// the replicas about a worker. Blocks are named by kvindex's content keys,
// already resolved from the engine's hashes and tokens, so a replica needs
// neither; an agent's index records the effects of each batch (Delta).
// A worker's whole resident set travels as snapshot segments in the
// index's own binary encoding, which transports carry as they are.

// DeltaOp is one kind of change to a worker's resident set.
type DeltaOp uint8

const (
	// DeltaStore is one more reference to Key in Medium; a worker that
	// does not hold the key attaches it under Parent (HasParent) or at the
	// top level.
	DeltaStore DeltaOp = iota + 1
	// DeltaRemove is one reference less to Key in Medium.
	DeltaRemove
	// DeltaDrop removes the references one engine block held to Key, Refs
	// per medium (a capacity eviction, or an engine hash reused for other
	// content).
	DeltaDrop
	// DeltaClear forgets every block of the worker.
	DeltaClear
)

// String returns the op's name.
func (o DeltaOp) String() string {
	switch o {
	case DeltaStore:
		return "STORE"
	case DeltaRemove:
		return "REMOVE"
	case DeltaDrop:
		return "DROP"
	case DeltaClear:
		return "CLEAR"
	}
	return "DeltaOp(?)"
}

// DeltaEntry is one change of a Delta.
type DeltaEntry struct {
	// Op is the change.
	Op DeltaOp
	// Key is the block's content key (not for DeltaClear).
	Key uint64
	// Parent is the key Key attaches under when HasParent (DeltaStore).
	Parent    uint64
	HasParent bool
	// Medium is the tier of DeltaStore and DeltaRemove.
	Medium Medium
	// Refs are the references DeltaDrop removes, per medium.
	Refs [NumMedia]uint8
	// BlockEdge says a DeltaStore starts one of the source's blocks (an
	// engine block, of which a key may have several), or a DeltaRemove
	// ends one; MediumEdge that it starts or ends its block's residency in
	// Medium (implied by BlockEdge). Replicas count blocks by them.
	BlockEdge, MediumEdge bool
}

// Delta is the effect of one batch on one worker's resident set, in order.
// It is reused between batches: Reset empties it, keeping its capacity.
type Delta struct {
	// Entries are the changes, in the order they apply.
	Entries []DeltaEntry
}

// Reset empties d, keeping its capacity.
func (d *Delta) Reset() { d.Entries = d.Entries[:0] }
