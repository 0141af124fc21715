package indexer

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/events"
)

// goldTokens are n token ids i*mul+7, the inputs of TestKeysAreStable.
func goldTokens(n, mul int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(i*mul + 7)
	}
	return t
}

// TestKeysAreStable pins key values: routers that send block_keys compute
// them with this function, so a change of any key is a protocol change
// (and needs a new keyVersion). The block sizes cover each of xxh3's input
// length classes (4-8, 9-16, 17-128, 129-240 and over 240 bytes).
func TestKeysAreStable(t *testing.T) {
	if got := RootKey("m", ""); got != 0xcf7500ac92d2ce19 {
		t.Errorf("RootKey(m) = %#016x", uint64(got))
	}
	if got := RootKey("m", "lora"); got != 0xb7a858d2791d3084 {
		t.Errorf("RootKey(m, lora) = %#016x", uint64(got))
	}
	for _, c := range []struct {
		bs   int
		want [3]Key
	}{
		{1, [3]Key{0x10e12ac8981f6f40, 0xbf81c40ba137f96b, 0xf1f308d098fbcead}},
		{2, [3]Key{0x366b2c41c19199bb, 0x3ff82cfc36caead8, 0xcff7157412c1bb81}},
		{4, [3]Key{0x0cfa6b6b36a18ee8, 0xd6266a3e888562da, 0xdc92d392e21572cb}},
		{5, [3]Key{0x6502f84b0123bd7f, 0x9c59141d741bede1, 0x0e48de638cd27391}},
		{8, [3]Key{0xebcf39b2f5ea9242, 0x5355e0d2a805ab6a, 0x330b07d7d821709d}},
		{16, [3]Key{0x529139eaa2cca86a, 0x8a4cb9d9b45fa031, 0x66fa5912b38ce5dc}},
		{17, [3]Key{0xa878a341a0b31d15, 0xc10b57f178f4cddb, 0xed4543d3d221d79e}},
		{24, [3]Key{0x6a1ebb1a612cac11, 0x9da78bb41e2fbbce, 0x68abb75fdf251e41}},
		{32, [3]Key{0xaa168c7b95686292, 0xce56e0c3614cf7ff, 0x343178aad8f9745b}},
		{33, [3]Key{0x5218fe923db3df89, 0x2a7cc611051662ca, 0x5252e82a7f51ebd4}},
		{60, [3]Key{0xfb08478c319de4c8, 0xf0012b185fad545f, 0xba556e26d62ea8e1}},
		{64, [3]Key{0xe3bd2d23013682ca, 0xdd3f7229e78fc186, 0x2098fbc60e616a11}},
	} {
		toks := goldTokens(3*c.bs+c.bs/2, 100003) // and a partial block, which has no key
		got := PromptKeys("m", c.bs, toks, nil, nil)
		if len(got) != 3 || [3]Key(got) != c.want {
			t.Errorf("block size %d: keys %#016x, want %#016x", c.bs, got, c.want)
		}
		// BlockKey chains the same keys.
		k := RootKey("m", "")
		for i := range 3 {
			if k = BlockKey(k, toks[i*c.bs:(i+1)*c.bs], nil); k != c.want[i] {
				t.Errorf("block size %d: BlockKey of block %d = %#016x, want %#016x", c.bs, i, uint64(k), uint64(c.want[i]))
			}
		}
	}
	extras := []struct {
		name string
		x    *PromptExtras
		want [3]Key
	}{
		{"lora and salt", &PromptExtras{LoRAName: "lora", CacheSalt: "salt"},
			[3]Key{0xe7cdd7f74588823d, 0x1a9023851880ad86, 0xf055421424c7c2fd}},
		{"block extras", &PromptExtras{BlockExtras: []events.ExtraKeys{nil, events.AppendString(events.AppendTuple(nil, 1), "img")}},
			[3]Key{0x0ed789021558e2c1, 0xe8947e98a118b439, 0x519bb5cbfbc2dc4f}},
	}
	for _, c := range extras {
		if got := PromptKeys("m", 16, goldTokens(48, 3), c.x, nil); len(got) != 3 || [3]Key(got) != c.want {
			t.Errorf("%s: keys %#016x, want %#016x", c.name, got, c.want)
		}
	}
	if got := orphanRoot(3, 0x1234); got != 0x2cf656459a45055c {
		t.Errorf("orphanRoot = %#016x", uint64(got))
	}
}

// TestHashTokensIsXXH3 checks hashTokens, and its token-id forms of
// xxh3's 17-128-byte path (hash16, hashMid), against xxh3.HashSeed of the
// tokens' little-endian bytes, for every token count up to 80 and random
// tokens and seeds.
func TestHashTokensIsXXH3(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	seeds := []uint64{0, 1, math.MaxUint64, 1 << 63}
	for range 200 {
		seeds = append(seeds, r.Uint64())
	}
	for n := range 81 {
		toks := make([]uint32, n)
		var b []byte
		for _, seed := range seeds {
			b = b[:0]
			for i := range toks {
				toks[i] = r.Uint32()
				if n%3 == 0 {
					toks[i] %= 151000 // vocabulary-sized ids too
				}
				b = binary.LittleEndian.AppendUint32(b, toks[i])
			}
			if got, want := hashTokens(toks, seed), xxh3.HashSeed(b, seed); got != want {
				t.Fatalf("%d tokens, seed %#x: %#016x, xxh3 %#016x", n, seed, got, want)
			}
		}
	}
}
