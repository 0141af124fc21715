package indexer

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/events"
)

// Key is kvindex's own content key of a block: a 64-bit hash chained from
// the parent block's key, over the block's token ids and extra keys, seeded
// by the model namespace and LoRA adapter. Equal keys mean equal prefixes
// (up to 64-bit collisions), whatever engine hash algorithm produced the
// event, so engines need no shared PYTHONHASHSEED and routers need no copy
// of vLLM's hashing.
type Key uint64

// keyVersion is mixed into every root so that a future change of the key
// function can never match keys computed by an older client.
const keyVersion = "kvindex-key-v1"

// RootKey is the key "before block 0" of every sequence of a model and LoRA
// adapter ("" for the base model). Blocks of different models or adapters
// never share a key because their chains start from different roots.
func RootKey(model, loraName string) Key {
	var stack [256]byte
	buf := stack[:0] // escapes to the heap only for names over ~240 bytes
	buf = append(buf, keyVersion...)
	buf = append(buf, 0)
	buf = append(buf, model...)
	buf = append(buf, 0)
	buf = append(buf, loraName...)
	return Key(xxh3.Hash(buf))
}

// BlockKey chains one block onto its parent's key. extra is the block's
// canonical extra keys (nil for none); a block with extra keys never has
// the key of the same tokens without them.
//
// Cost: one xxh3 pass over 4 bytes per token (about 10 ns for a 16-token
// block on this machine), no allocation.
func BlockKey(parent Key, tokens []uint32, extra events.ExtraKeys) Key {
	h := hashTokens(tokens, uint64(parent))
	if extra != nil {
		h = xxh3.HashSeed(extra, h^extraMix)
	}
	return Key(h)
}

// extraMix separates the extra-keys pass from the token pass.
const extraMix = 0x9e3779b97f4a7c15

// littleEndian reports whether the []uint32 memory layout already is the
// little-endian byte order that keys are defined over.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// hashTokens hashes tokens as little-endian uint32s. On little-endian
// machines it views the slice's memory directly (no copy).
func hashTokens(tokens []uint32, seed uint64) uint64 {
	if len(tokens) == 0 {
		return xxh3.HashSeed(nil, seed)
	}
	if littleEndian {
		b := unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), len(tokens)*4)
		return xxh3.HashSeed(b, seed)
	}
	var stack [1024]byte
	b := stack[:0]
	if len(tokens)*4 > len(stack) {
		b = make([]byte, 0, len(tokens)*4)
	}
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	return xxh3.HashSeed(b, seed)
}

// PromptExtras are the request-side inputs that vLLM mixes into block
// hashes, so that a prompt's keys are computed exactly as the engine's
// blocks were.
type PromptExtras struct {
	// LoRAName is the adapter the request runs with ("" for the base model).
	// vLLM puts it first in every block's extra keys.
	LoRAName string
	// CacheSalt is the request's cache_salt ("" for none). vLLM puts it in
	// the first block's extra keys only, after the LoRA name.
	CacheSalt string
	// BlockExtras, when non-nil, gives each block's complete extra keys
	// (e.g. for multimodal prompts, where the engine adds (identifier,
	// offset) pairs) and overrides LoRAName and CacheSalt for extra keys;
	// LoRAName still selects the root. Blocks past its end have none.
	BlockExtras []events.ExtraKeys
}

// blockExtras returns the canonical extra keys of block i as vLLM builds
// them: (lora_name?, cache_salt if i == 0?), or nil when empty. scratch is
// reused for the encoding.
func (p *PromptExtras) blockExtras(i int, scratch []byte) (events.ExtraKeys, []byte) {
	if p == nil {
		return nil, scratch
	}
	if p.BlockExtras != nil {
		if i < len(p.BlockExtras) {
			return p.BlockExtras[i], scratch
		}
		return nil, scratch
	}
	n := 0
	if p.LoRAName != "" {
		n++
	}
	if i == 0 && p.CacheSalt != "" {
		n++
	}
	if n == 0 {
		return nil, scratch
	}
	b := events.AppendTuple(scratch[:0], n)
	if p.LoRAName != "" {
		b = events.AppendString(b, p.LoRAName)
	}
	if i == 0 && p.CacheSalt != "" {
		b = events.AppendString(b, p.CacheSalt)
	}
	return events.ExtraKeys(b), b
}

// PromptKeys appends to dst the content keys of every full block of tokens
// for the given model namespace and block size, chained from the root of
// (model, extras.LoRAName). A trailing partial block has no key. extras may
// be nil. It is the request-side twin of how the index keys BlockStored
// events, and it is what a router-side client computes when it sends
// block keys instead of token ids.
//
// Cost: one BlockKey per block; allocation-free when dst has capacity and
// the extras are empty or fit in 128 bytes.
func PromptKeys(model string, blockSize int, tokens []uint32, extras *PromptExtras, dst []Key) []Key {
	if blockSize <= 0 {
		return dst
	}
	lora := ""
	if extras != nil {
		lora = extras.LoRAName
	}
	k := RootKey(model, lora)
	var stack [128]byte
	scratch := stack[:0]
	var ex events.ExtraKeys
	for i := 0; (i+1)*blockSize <= len(tokens); i++ {
		ex, scratch = extras.blockExtras(i, scratch)
		k = BlockKey(k, tokens[i*blockSize:(i+1)*blockSize], ex)
		dst = append(dst, k)
	}
	return dst
}
