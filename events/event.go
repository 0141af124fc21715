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
	localityNames = [...]string{"LOCAL", "REMOTE"}
	deltaOpNames  = [...]string{"", "STORE", "REMOVE", "DROP", "CLEAR"}
)

// enumName returns names[v], or typ(v) for a value without a name.
func enumName[T ~uint8](typ string, v T, names []string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return typ + "(" + strconv.Itoa(int(v)) + ")"
}

// Medium is the storage tier class a block is resident in; the zero value
// is GPU (vLLM's nil). The index packs a worker's media into NumMedia bits
// (indexer's engine entries and holder sets), so the classes stay six: the
// many tier names engines and connectors send map onto them (ParseMedium,
// the table below), and an operator maps others (Tiers).
//
// # Medium names
//
// Names are compared ignoring case; a name's class is where the index
// holds the block and what scoring weighs it by. Sources, by name:
//
//	GPU            GPU       vLLM vllm/distributed/kv_events.py MEDIUM_GPU (nil means GPU)
//	DEVICE         GPU       Dynamo lib/kv-router/src/protocols.rs StorageTier::from_kv_medium
//	CPU            CPU       vLLM kv_events.py MEDIUM_CPU (OffloadingConnector, vllm/v1/kv_offload/base.py Medium.CPU);
//	                         LMCache's multi-process connector
//	cpu            CPU       LMCache's vLLM adapter; vLLM's Mooncake store connector
//	CPU_PINNED     CPU       SGLang (host memory); Dynamo from_kv_medium
//	CPU_TIER1      CPU       Dynamo KVBM's host tier (G2), also on SGLang HiCache events; Dynamo from_kv_medium
//	STORAGE        STORAGE   vLLM kv_events.py MEDIUM_STORAGE (kv_offload/base.py Medium.STORAGE)
//	SHARED_STORAGE STORAGE   llm-d llm-d-kv-cache kv_connectors/llmd_fs_backend (event_publisher.py, mediums.py)
//	FS             STORAGE   a file-system tier, as SHARED_STORAGE (no sender seen)
//	DISK           DISK      SGLang; vLLM's early kv_offload/mediums.py DiskLoadStoreSpec ("Disk")
//	CPU_TIER2      DISK      Dynamo KVBM's disk tier (G3); Dynamo from_kv_medium
//	NVME           DISK      Dynamo from_kv_medium
//	EXTERNAL       EXTERNAL  SGLang
//	OBJECT_STORE   EXTERNAL  llm-d llmd_fs_backend event_publisher.py StorageMedium.OBJECT_STORE
//	OBJ            EXTERNAL  an object store, as OBJECT_STORE: llm-d's object backend is configured
//	                         "backend": "OBJ" (NIXL's OBJ memory type); no sender seen
//	REMOTE, NETWORK, SHARED
//	               EXTERNAL  Dynamo from_kv_medium
//
// Any other name is MediumOther unless configured (Tiers). A block whose
// event says locality REMOTE is held in MediumExternal whatever its name:
// it is not in the publishing engine's own memory.
type Medium uint8

const (
	// MediumGPU is device memory (vLLM's nil or "GPU").
	MediumGPU Medium = iota
	// MediumCPU is host memory ("CPU", LMCache's "cpu", SGLang's "CPU_PINNED").
	MediumCPU
	// MediumStorage is a storage tier such as an offload connector's file
	// system ("STORAGE", "SHARED_STORAGE").
	MediumStorage
	// MediumDisk is local disk ("DISK").
	MediumDisk
	// MediumExternal is a remote store ("EXTERNAL", an object store), and
	// any block whose event says locality REMOTE.
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

// mediumAliases are the names engines and connectors send besides the class
// names, with their class (the table in Medium's doc; case is ignored).
var mediumAliases = [...]struct {
	name string
	m    Medium
}{
	{"DEVICE", MediumGPU},
	{"CPU_PINNED", MediumCPU}, {"CPU_TIER1", MediumCPU},
	{"SHARED_STORAGE", MediumStorage}, {"FS", MediumStorage},
	{"CPU_TIER2", MediumDisk}, {"NVME", MediumDisk},
	{"OBJECT_STORE", MediumExternal}, {"OBJ", MediumExternal},
	{"REMOTE", MediumExternal}, {"NETWORK", MediumExternal}, {"SHARED", MediumExternal},
}

// ParseMedium normalises a medium name, ignoring case: "" is GPU, a known
// name is its class (Medium's table), and unknown names are MediumOther
// with ok=false.
func ParseMedium(s string) (m Medium, ok bool) {
	if s == "" {
		return MediumGPU, true
	}
	if m, ok := ParseMediumClass(s); ok && m != MediumOther {
		return m, true
	}
	for _, a := range mediumAliases {
		if strings.EqualFold(s, a.name) {
			return a.m, true
		}
	}
	return MediumOther, false
}

// ParseMediumClass returns the class a class name ("gpu", "cpu",
// "storage", "disk", "external" or "other", any case) names; ok is false
// for anything else, aliases included.
func ParseMediumClass(s string) (m Medium, ok bool) {
	for m := range Medium(NumMedia) {
		if strings.EqualFold(s, m.String()) {
			return m, true
		}
	}
	return MediumOther, false
}

// Locality says whether a block is in the publishing engine's own memory
// or storage (vLLM's locality, LOCAL or REMOTE, relative to the publisher;
// vllm/v1/kv_offload/base.py Locality).
type Locality uint8

const (
	// LocalityLocal is the publisher's own (vLLM's LOCAL, or no locality).
	LocalityLocal Locality = iota
	// LocalityRemote is another instance's or a shared remote tier's
	// (vLLM's REMOTE, and any locality name kvindex does not know: such a
	// block is never credited as the engine's own).
	LocalityRemote
)

// String returns vLLM's name of the locality.
func (l Locality) String() string { return enumName("Locality", l, localityNames[:]) }

// ParseLocality reads vLLM's locality, ignoring case: "" and LOCAL are
// local, REMOTE remote; other names are remote with ok=false.
func ParseLocality(s string) (l Locality, ok bool) {
	switch {
	case s == "", strings.EqualFold(s, "LOCAL"):
		return LocalityLocal, true
	case strings.EqualFold(s, "REMOTE"):
		return LocalityRemote, true
	}
	return LocalityRemote, false
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
	// Medium is the tier class the block is held in; MediumName is the name
	// as sent ("" for nil). A REMOTE locality makes Medium MediumExternal.
	Medium     Medium
	MediumName string
	// Locality is vLLM's locality (map era key "locality"; absent: local).
	Locality Locality
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
	// UnknownEvents counts events whose tag kvindex does not know (a newer
	// engine's event type): well-formed, skipped, and left out of Events.
	// UnknownTag is the last such tag, cut to 40 bytes.
	UnknownEvents int
	UnknownTag    string
}
