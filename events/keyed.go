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
	// Group is 0 for a change to the worker's prefix residency (its anchor
	// KV-cache group's blocks), else 1 + the index of the side group (a
	// group that caps hits: sliding window, mamba, another prefix group)
	// whose Key becomes held (DeltaStore) or no longer held (DeltaRemove).
	// Only those two ops name a group, and never a parent.
	Group uint8
}

// KVGroup describes one KV-cache group of a worker, as an agent's index
// learned it from the engine's BlockStored events (group_idx,
// kv_cache_spec_kind, block_size, kv_cache_spec_sliding_window): what a
// replica needs to hold the group's keys and cap hits by them.
type KVGroup struct {
	Index     int    // group_idx.
	Kind      string // kv_cache_spec_kind as the engine sent it ("" when none).
	BlockSize int    // tokens per block (0 until a store with tokens).
	Window    int    // the sliding window in tokens (0 when none).
	// Anchor marks the group whose blocks are the worker's prefix
	// residency; the others are side groups.
	Anchor bool
}

// Delta is the effect of one batch on one worker's resident set, in order;
// reused between batches.
type Delta struct {
	Entries []DeltaEntry
	// Layout, when not empty, is the worker's KV-cache groups after the
	// batch, which changed them (a group learned or described anew); a
	// replica adopts it before it applies Entries. Empty: unchanged.
	Layout []KVGroup
}

// Reset empties d, keeping its capacity.
func (d *Delta) Reset() {
	d.Entries = d.Entries[:0]
	d.Layout = d.Layout[:0]
}
