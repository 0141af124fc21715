package events

// The keyed model: what an agent tells replicas about a worker. Blocks are
// named by content keys already resolved from the engine's hashes and
// tokens; an agent's index records each batch's effects (Delta), and a
// worker's resident set travels as snapshot segments in the index's encoding.

// DeltaOp is one kind of change to a worker's resident set.
type DeltaOp uint8

const (
	// DeltaStore is one more reference to Key in Medium; a new key attaches
	// under Parent (HasParent) or at the top level.
	DeltaStore DeltaOp = iota + 1
	// DeltaRemove is one reference less to Key in Medium.
	DeltaRemove
	// DeltaDrop removes the references (Refs, per medium) one engine block
	// held to Key: a capacity eviction, or an engine hash reused.
	DeltaDrop
	// DeltaClear forgets every block of the worker.
	DeltaClear
)

// String returns the op's name.
func (o DeltaOp) String() string {
	return enumName("DeltaOp", o, deltaOpNames[:])
}

// DeltaEntry is one change of a Delta.
type DeltaEntry struct {
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
	// BlockEdge: a DeltaStore starts (a DeltaRemove ends) one of the source's
	// engine blocks; MediumEdge: it starts or ends the block's residency in
	// Medium (implied by BlockEdge). Replicas count blocks by them.
	BlockEdge, MediumEdge bool
}

// Delta is the effect of one batch on one worker's resident set, in order;
// reused between batches.
type Delta struct {
	Entries []DeltaEntry
}

// Reset empties d, keeping its capacity.
func (d *Delta) Reset() { d.Entries = d.Entries[:0] }
