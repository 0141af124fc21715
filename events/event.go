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
	return enumName("Kind", k, kindNames[:])
}

// Name tables of the enums, read only. They are package arrays, not
// literals at the call, so String allocates nothing: a slice literal whose
// strings are returned escapes to the heap on every call.
var (
	kindNames     = [...]string{"", "BlockStored", "BlockRemoved", "AllBlocksCleared"}
	mediumNames   = [...]string{"GPU", "CPU", "STORAGE", "DISK", "EXTERNAL", "OTHER"}
	encodingNames = [...]string{"array", "map"}
	hashNames     = [...]string{"uint64", "int64", "bin32"}
	envelopeNames = [...]string{"array3", "array2", "map"}
	deltaOpNames  = [...]string{"", "STORE", "REMOVE", "DROP", "CLEAR"}
)

// enumName returns names[v], or typ(v) for a value without a name.
func enumName[T ~uint8](typ string, v T, names []string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return typ + "(" + strconv.Itoa(int(v)) + ")"
}

// Medium is the storage tier a block is resident in; the zero value is GPU
// (vLLM's nil).
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
	// MediumOther is any medium name kvindex does not know (kept, not dropped).
	MediumOther
	// NumMedia is the number of Medium values; arrays indexed by Medium use it.
	NumMedia = int(MediumOther) + 1
)

// String returns the normalised, upper-case name of the medium.
func (m Medium) String() string {
	return enumName("Medium", m, mediumNames[:])
}

// ParseMedium normalises a medium name, ignoring case: "" is GPU, CPU_PINNED
// is host memory, and unknown names are MediumOther with ok=false.
func ParseMedium(s string) (m Medium, ok bool) {
	switch {
	case s == "":
		return MediumGPU, true
	case strings.EqualFold(s, "CPU_PINNED"):
		return MediumCPU, true
	}
	for m := range MediumOther {
		if strings.EqualFold(s, m.String()) {
			return m, true
		}
	}
	return MediumOther, false
}

// Event is one decoded KV event, whichever wire encoding it arrived in.
// Fields the wire may leave out carry a Has* flag; fields that do not apply
// to the Kind are zero.
type Event struct {
	Kind Kind
	// BlockHashes are the engine's block hashes in chain order, folded to 64
	// bits: opaque ids meaningful only within one engine.
	BlockHashes []uint64
	// ParentHash is the hash of the block before the first; valid when
	// HasParent (nil on the wire: block 0 of a sequence).
	ParentHash uint64
	HasParent  bool
	// TokenIDs are all blocks' tokens, concatenated; empty for offload
	// events that only add a medium to known blocks.
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
	// SpecKind is kv_cache_spec_kind ("full_attention", ...), "" when absent.
	SpecKind string
	// SlidingWindow is kv_cache_spec_sliding_window; valid when HasSlidingWindow.
	SlidingWindow    int
	HasSlidingWindow bool
	// CacheSalt is SGLang's event-level cache_salt (map events only); vLLM
	// puts its salt in ExtraKeys.
	CacheSalt string
}

// Batch is one ZMQ message's payload: the events of one engine step.
type Batch struct {
	// Timestamp is the engine's wall-clock time, seconds since the epoch.
	Timestamp float64
	// Events are in the order they must be applied.
	Events []Event
	// DPRank is the publishing data-parallel rank; valid when HasDPRank
	// (vLLM 0.9 sent none).
	DPRank    int
	HasDPRank bool
}
