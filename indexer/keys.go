package indexer

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/events"
)

// Key is kvindex's own content key of a block: a 64-bit hash chained from
// the parent block's key over the block's token ids and extra keys, from a
// root naming the model and LoRA adapter. Equal keys mean equal prefixes
// (up to 64-bit collisions), whatever engine hash produced the event.
type Key uint64

// keyVersion is mixed into every root, so that keys of another key
// function never match.
const keyVersion = "kvindex-key-v1"

// RootKey is the key "before block 0" of every sequence of a model and
// LoRA adapter ("" for the base model).
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
// canonical extra keys (nil for none). Cost: about 6 ns for a 16-token
// block, no allocation.
func BlockKey(parent Key, tokens []uint32, extra events.ExtraKeys) Key {
	h := hashTokens(tokens, uint64(parent))
	if extra != nil {
		h = xxh3.HashSeed(extra, h^extraMix)
	}
	return Key(h)
}

// extraMix separates the extra-keys pass from the token pass.
const extraMix = 0x9e3779b97f4a7c15

// littleEndian reports whether []uint32 memory is already little-endian.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// hashTokens is xxh3.HashSeed of tokens as little-endian uint32 bytes:
// blocks of 5 to 32 tokens through hashMid, others through the slice's
// memory (copied to little-endian bytes on big-endian machines).
func hashTokens(tokens []uint32, seed uint64) uint64 {
	switch n := len(tokens); {
	case n == 16:
		return hash16((*[16]uint32)(tokens), seed)
	case n >= 5 && n <= 32:
		return hashMid(tokens, seed)
	case n == 0:
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

// The words of XXH3's default secret that its 17-128-byte path reads, and
// XXH64's first prime.
const (
	secret000 = 0xbe4ba423396cfeb8
	secret008 = 0x1cad21f72c81017c
	secret016 = 0xdb979083e96dd4de
	secret024 = 0x1f67b3b7a4a44072
	secret032 = 0x78e5c0cc4ee679cb
	secret040 = 0x2172ffcc7dd05a82
	secret048 = 0x8e2443f7744608b8
	secret056 = 0x4c263a81e69035e0
	secret064 = 0xcb00c391bb52283c
	secret072 = 0xa32e531b8b65d088
	secret080 = 0x4ef90da297486471
	secret088 = 0xd8acdea946ef1938
	secret096 = 0x3f349ce33f76faa8
	secret104 = 0x1d4f0bc7c7bbdcf9
	secret112 = 0x3159b4cd4be0518a
	secret120 = 0x647378d9c97e9fc8
	xxPrime64 = 11400714785074694791
)

// hash16 is xxh3.HashSeed of a 16-token block's 64 bytes, computed from
// the token ids (each pair one load, no length switch or bounds check): a
// chain of keys costs within 4% of a chain of xxh3.HashSeed calls.
// TestHashTokensIsXXH3 checks it against xxh3.
func hash16(t *[16]uint32, seed uint64) uint64 {
	acc := uint64(0x8dde6c617af2a1c0) // 64 * xxPrime64, wrapped
	acc += mulFold(pair(t[4], t[5])^(secret032+seed), pair(t[6], t[7])^(secret040-seed))
	acc += mulFold(pair(t[8], t[9])^(secret048+seed), pair(t[10], t[11])^(secret056-seed))
	acc += mulFold(pair(t[0], t[1])^(secret000+seed), pair(t[2], t[3])^(secret008-seed))
	acc += mulFold(pair(t[12], t[13])^(secret016+seed), pair(t[14], t[15])^(secret024-seed))
	return avalanche(acc)
}

// hashMid is hash16 for 5 to 32 tokens.
func hashMid(t []uint32, seed uint64) uint64 {
	n := len(t)
	acc := uint64(n*4) * xxPrime64
	mix := func(j int, s1, s2 uint64) uint64 {
		return mulFold(pair(t[j], t[j+1])^(s1+seed), pair(t[j+2], t[j+3])^(s2-seed))
	}
	if n > 8 {
		if n > 16 {
			if n > 24 {
				acc += mix(12, secret096, secret104)
				acc += mix(n-16, secret112, secret120)
			}
			acc += mix(8, secret064, secret072)
			acc += mix(n-12, secret080, secret088)
		}
		acc += mix(4, secret032, secret040)
		acc += mix(n-8, secret048, secret056)
	}
	acc += mix(0, secret000, secret008)
	acc += mix(n-4, secret016, secret024)
	return avalanche(acc)
}

// pair is the little-endian 8 bytes of tokens a, b as one word.
func pair(a, b uint32) uint64 { return uint64(a) | uint64(b)<<32 }

func mulFold(x, y uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	return hi ^ lo
}

// avalanche is XXH3's final mix of the 17-128-byte path.
func avalanche(x uint64) uint64 {
	x ^= x >> 37
	x *= 0x165667919e3779f9
	return x ^ x>>32
}

// PromptExtras are the request-side inputs that vLLM mixes into block
// hashes.
type PromptExtras struct {
	LoRAName  string // the adapter ("" for the base model), first in every block's extra keys.
	CacheSalt string // the request's cache_salt, in the first block's extra keys only, after the LoRA name.
	// BlockExtras, when non-nil, gives each block's complete extra keys
	// (e.g. multimodal (identifier, offset) pairs) in place of LoRAName's
	// and CacheSalt's (LoRAName still selects the root); blocks past it
	// have none.
	BlockExtras []events.ExtraKeys
}

// blockExtras returns block i's canonical extra keys as vLLM builds them,
// (lora_name?, cache_salt if i == 0?), or nil; scratch is reused.
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
// for the model and block size, chained from the root of (model,
// extras.LoRAName), exactly as the index keys BlockStored events. extras
// may be nil. Cost: one BlockKey per block (about 6 ns per 16-token block);
// no allocation when dst has capacity and the extras fit in 128 bytes.
func PromptKeys(model string, blockSize int, tokens []uint32, extras *PromptExtras, dst []Key) []Key {
	if blockSize <= 0 {
		return dst
	}
	lora := ""
	if extras != nil {
		lora = extras.LoRAName
	}
	k := RootKey(model, lora)
	n := len(tokens) / blockSize
	var stack [128]byte
	switch {
	case extras == nil || extras.BlockExtras == nil && extras.LoRAName == "" && extras.CacheSalt == "":
		return chainKeys(k, blockSize, tokens, nil, dst)
	case extras.BlockExtras == nil && extras.CacheSalt == "":
		// The adapter's extra keys are the same for every block.
		ex, _ := extras.blockExtras(0, stack[:0])
		return chainKeys(k, blockSize, tokens, ex, dst)
	}
	scratch := stack[:0]
	var ex events.ExtraKeys
	for i := range n {
		ex, scratch = extras.blockExtras(i, scratch)
		k = BlockKey(k, tokens[i*blockSize:(i+1)*blockSize], ex)
		dst = append(dst, k)
	}
	return dst
}

// chainKeys appends the keys of every full block of tokens chained from
// k, each with the extra keys ex.
func chainKeys(k Key, blockSize int, tokens []uint32, ex events.ExtraKeys, dst []Key) []Key {
	n := len(tokens) / blockSize
	l := len(dst)
	dst = slices.Grow(dst, n)[:l+n]
	out := dst[l:]
	if blockSize == 16 && ex == nil {
		h := uint64(k)
		for i := range out {
			h = hash16((*[16]uint32)(tokens[i*16:]), h)
			out[i] = Key(h)
		}
		return dst
	}
	for i := range out {
		k = BlockKey(k, tokens[i*blockSize:(i+1)*blockSize], ex)
		out[i] = k
	}
	return dst
}
