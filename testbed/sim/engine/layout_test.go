package engine

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// heldSet builds HybridHit's held from each group's held block positions.
func heldSet(groups ...[]int) func(g, i int) bool {
	return func(g, i int) bool { return slices.Contains(groups[g], i) }
}

func span(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func TestHybridHit(t *testing.T) {
	full := Group{Kind: KindFullAttention}
	mla := Group{Kind: KindMLAAttention}
	mamba := Group{Kind: KindMamba}
	win := func(w int) Group { return Group{Kind: KindSlidingWindow, SlidingWindow: w} }
	// Block size 16 throughout: a window of 128 tokens needs
	// cdiv(127, 16) = 8 held blocks before the cut, 33 needs 2, 17 needs 1.
	for _, tc := range []struct {
		name   string
		groups []Group
		max    int
		held   func(g, i int) bool
		want   int
	}{
		{"full: the run from block 0", []Group{full}, 8, heldSet(span(0, 5)), 5},
		{"full: capped at max (prompt_len-1 in blocks)", []Group{full}, 3, heldSet(span(0, 10)), 3},
		{"full: a gap ends the run", []Group{full}, 8, heldSet([]int{0, 1, 3, 4}), 2},
		{"nothing to hit", []Group{full}, 0, heldSet(span(0, 4)), 0},
		{"mla is full attention", []Group{mla}, 8, heldSet(span(0, 6)), 6},
		{"window: 8 blocks before the full cut", []Group{win(128), full}, 20, heldSet(span(10, 20), span(0, 20)), 20},
		{"window: the run before a shorter full cut", []Group{win(128), full}, 20, heldSet(span(0, 20), span(0, 13)), 13},
		{"window: runs of 6 and 3 too short, block 0 missing", []Group{win(128), full}, 20,
			heldSet(append(span(10, 16), 17, 18, 19), span(0, 20)), 0},
		{"window: no run of 8, the run from block 0", []Group{win(128), full}, 20, heldSet(span(0, 5), span(0, 20)), 5},
		{"window: the rightmost run of 8 wins", []Group{win(128), full}, 20,
			heldSet(append(span(1, 9), span(11, 19)...), span(0, 20)), 19},
		{"window of 17: one block before the cut", []Group{win(17), full}, 20, heldSet([]int{13}, span(0, 20)), 14},
		{"mamba: the state at the cut", []Group{mamba, full}, 20, heldSet([]int{3, 9}, span(0, 20)), 10},
		{"mamba: the rightmost state within max", []Group{mamba, full}, 9, heldSet([]int{3, 9}, span(0, 20)), 4},
		{"mamba: the rightmost state within the full run", []Group{mamba, full}, 20, heldSet([]int{3, 9}, span(0, 7)), 4},
		{"mamba: no state", []Group{mamba, full}, 20, heldSet(nil, span(0, 20)), 0},
		// Pass 1: full 12, window 12 (10, 11), mamba 8 (7). Pass 2: window
		// within 8 takes (3, 4): 5; mamba within 5 takes 4: 5. Pass 3
		// agrees at 5.
		{"window and mamba iterate", []Group{win(33), mamba, full}, 12,
			heldSet([]int{3, 4, 10, 11}, []int{4, 7}, span(0, 12)), 5},
		// The same, but no state below 5: mamba cuts to 0.
		{"window and mamba iterate to nothing", []Group{win(33), mamba, full}, 12,
			heldSet([]int{3, 4, 10, 11}, []int{7}, span(0, 12)), 0},
		// Groups of one spec are looked up together: block 8 missing in
		// the second window group breaks the run (9 | 7 6).
		{"one spec, several groups", []Group{win(33), win(33), full}, 10,
			heldSet(span(0, 10), []int{0, 1, 2, 3, 4, 5, 6, 7, 9}, span(0, 10)), 8},
		{"qwen3-next order: mamba groups first", []Group{mamba, mamba, mamba, full}, 20,
			heldSet([]int{5, 11}, []int{5, 11}, []int{5}, span(0, 20)), 6},
	} {
		if got := HybridHit(tc.groups, 16, tc.max, tc.held); got != tc.want {
			t.Errorf("%s: HybridHit = %d blocks, want %d", tc.name, got, tc.want)
		}
	}
}

func TestPresets(t *testing.T) {
	want := map[string]string{
		"llama":       "one full_attention group",
		"deepseek":    "deepseek: 1 mla_attention",
		"deepseek-v4": "deepseek-v4: 1 mla_attention",
		"gemma3":      "gemma3: 5 sliding_window (window 1024) + 1 full_attention",
		"gpt-oss":     "gpt-oss: 1 sliding_window (window 128) + 1 full_attention",
		"qwen3-next":  "qwen3-next: 3 mamba + 1 full_attention",
	}
	blocks := map[string]int{"llama": 16, "deepseek": 64, "deepseek-v4": 256, "gemma3": 16, "gpt-oss": 16, "qwen3-next": 544}
	if got := strings.Join(PresetNames(), ","); got != "deepseek,deepseek-v4,gemma3,gpt-oss,llama,qwen3-next" {
		t.Fatalf("presets %s", got)
	}
	for name, s := range want {
		l, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if l.String() != s {
			t.Errorf("%s: %q, want %q", name, l.String(), s)
		}
		e, err := New(0, Config{Layout: l})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if e.Config().BlockSize != blocks[name] {
			t.Errorf("%s: block size %d, want %d", name, e.Config().BlockSize, blocks[name])
		}
		// --block-size wins over the preset's.
		if e, _ := New(0, Config{Layout: l, BlockSize: 32}); e.Config().BlockSize != 32 {
			t.Errorf("%s: block size %d, want the configured 32", name, e.Config().BlockSize)
		}
	}
	if _, err := Preset("llama-4"); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "gpt-oss") {
		t.Errorf("unknown preset: %v", err)
	}
}

func TestLayoutValidation(t *testing.T) {
	for _, tc := range []struct {
		l    Layout
		want string
	}{
		{Layout{Groups: []Group{{Kind: "cross_attention"}}}, `"cross_attention" is not modelled`},
		{Layout{Groups: []Group{{Kind: KindSlidingWindow}}}, "sliding window 0"},
		{Layout{Groups: []Group{{Kind: KindFullAttention, SlidingWindow: 4}}}, "has a sliding window"},
		{Layout{Groups: slices.Repeat([]Group{{Kind: KindMamba}}, 65)}, "65 KV-cache groups"},
	} {
		_, err := New(0, Config{Layout: tc.l})
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.l, err, tc.want)
		}
	}
	_, err := New(0, Config{Layout: Layout{Groups: []Group{{Kind: KindMamba}}}, BlockSize: 544, MaxBatchedTokens: 512})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "mamba") {
		t.Errorf("a budget below a mamba block: %v", err)
	}
}

// TestFitsCountsEveryGroup checks Fits against each group's peak: full
// attention holds every block, a window its span plus a chunk, mamba two.
func TestFitsCountsEveryGroup(t *testing.T) {
	l := Layout{Groups: []Group{{Kind: KindSlidingWindow, SlidingWindow: 8}, {Kind: KindMamba}, {Kind: KindFullAttention}}}
	e, err := New(0, Config{Layout: l, BlockSize: 4, CacheBlocks: 20, MaxBatchedTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	// 60 tokens: full 15 + window min(15, cdiv(8+7, 4)+2 = 6) + mamba 2 = 23.
	if e.Fits(req(1, 4, workload.Segment{ID: 1, Len: 56})) {
		t.Error("60 tokens fit 20 blocks of 3 groups")
	}
	// 48 tokens: 12 + 6 + 2 = 20.
	if !e.Fits(req(1, 4, workload.Segment{ID: 1, Len: 44})) {
		t.Error("48 tokens do not fit 20 blocks")
	}
}
