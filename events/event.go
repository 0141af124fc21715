package events

import (
	"strconv"
	"strings"
)

// Kind says which of vLLM's three KV events an Event is.
type Kind uint8

const (
	// KindBlockStored announces blocks that became full and cached.
	KindBlockStored Kind = iota + 1
	// KindBlockRemoved announces blocks evicted from one medium.
	KindBlockRemoved
	// KindAllBlocksCleared announces that the engine dropped its whole prefix cache.
	KindAllBlocksCleared
)

// String returns vLLM's tag for the kind ("BlockStored", ...).
func (k Kind) String() string {
	return enumName("Kind", k, "", "BlockStored", "BlockRemoved", "AllBlocksCleared")
}

// enumName returns names[v], or typ(v) for a value without a name.
func enumName[T ~uint8](typ string, v T, names ...string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return typ + "(" + strconv.Itoa(int(v)) + ")"
}

// Medium is the storage tier a block is resident in. The zero value is GPU,
// which is what vLLM means when it sends nil.
type Medium uint8

const (
	// MediumGPU is device memory (vLLM's nil or "GPU").
	MediumGPU Medium = iota
	// MediumCPU is host memory ("CPU", LMCache's "cpu", SGLang's "CPU_PINNED").
	MediumCPU
	// MediumStorage is a storage tier such as an offload connector ("STORAGE").
	MediumStorage
	// MediumDisk is local disk ("DISK").
	MediumDisk
	// MediumExternal is a remote store ("EXTERNAL").
	MediumExternal
	// MediumOther is any medium name kvindex does not know; it is kept
	// apart from the known tiers rather than dropped.
	MediumOther
	// NumMedia is the number of Medium values; arrays indexed by Medium use it.
	NumMedia = int(MediumOther) + 1
)

// String returns the normalised, upper-case name of the medium.
func (m Medium) String() string {
	return enumName("Medium", m, "GPU", "CPU", "STORAGE", "DISK", "EXTERNAL", "OTHER")
}

// ParseMedium normalises a medium name as engines send it: case is ignored,
// "" means GPU, CPU_PINNED is host memory, and unknown names map to
// MediumOther (ok=false) so that the caller can count them.
func ParseMedium(s string) (m Medium, ok bool) {
	switch {
	case s == "" || strings.EqualFold(s, "GPU"):
		return MediumGPU, true
	case strings.EqualFold(s, "CPU") || strings.EqualFold(s, "CPU_PINNED"):
		return MediumCPU, true
	case strings.EqualFold(s, "STORAGE"):
		return MediumStorage, true
	case strings.EqualFold(s, "DISK"):
		return MediumDisk, true
	case strings.EqualFold(s, "EXTERNAL"):
		return MediumExternal, true
	}
	return MediumOther, false
}

// Event is one decoded KV event in kvindex's own model, independent of the
// wire encoding (positional array or tagged map) it arrived in.
//
// Fields that the wire may leave out carry a Has* flag; a field that does
// not apply to the event's Kind is left zero.
type Event struct {
	// Kind is the event type.
	Kind Kind
	// BlockHashes are the engine's own hashes of the blocks, in chain order,
	// folded to 64 bits (see the package doc). They are opaque ids that are
	// only meaningful within one engine.
	BlockHashes []uint64
	// ParentHash is the engine hash of the block before the first one;
	// valid only when HasParent (nil on the wire means block 0 of a sequence).
	ParentHash uint64
	HasParent  bool
	// TokenIDs are the tokens of all blocks in the event, concatenated. Empty
	// for CPU-offload events that only add a medium to known blocks.
	TokenIDs []uint32
	// BlockSize is tokens per block (0 in offload events).
	BlockSize int
	// LoRAID is the deprecated numeric adapter id; valid when HasLoRAID.
	LoRAID    int64
	HasLoRAID bool
	// Medium is the normalised tier; MediumName is the name as sent ("" for nil).
	Medium     Medium
	MediumName string
	// LoRAName is the adapter name ("" for the base model).
	LoRAName string
	// ExtraKeys has one entry per block hash when the engine sent extra_keys
	// (an entry is nil where the engine sent None); nil when it sent none.
	ExtraKeys []ExtraKeys
	// GroupIdx is the KV-cache group of hybrid models; valid when HasGroupIdx.
	GroupIdx    int
	HasGroupIdx bool
	// SpecKind is the group's kv_cache_spec_kind ("full_attention",
	// "sliding_window", ...), "" when absent.
	SpecKind string
	// SlidingWindow is kv_cache_spec_sliding_window; valid when HasSlidingWindow.
	SlidingWindow    int
	HasSlidingWindow bool
	// CacheSalt is the event-level cache_salt SGLang's map events carry ("" when
	// absent); vLLM puts its salt in ExtraKeys instead. The array era has no
	// slot for it.
	CacheSalt string
}

// Batch is one ZMQ message's payload: the events of one engine step.
type Batch struct {
	// Timestamp is the engine's wall-clock time in seconds since the epoch.
	Timestamp float64
	// Events are in the order they must be applied.
	Events []Event
	// DPRank is the data-parallel rank that published the batch; valid when
	// HasDPRank (vLLM 0.9 sent no rank).
	DPRank    int
	HasDPRank bool
}
