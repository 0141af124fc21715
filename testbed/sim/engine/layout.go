package engine

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// The kinds of KV-cache group a Layout may hold: vLLM's kv_cache_spec_kind
// values the engine models.
const (
	KindFullAttention     = "full_attention"
	KindMLAAttention      = "mla_attention"
	KindSinkFullAttention = "sink_full_attention"
	KindSlidingWindow     = "sliding_window"
	KindSlidingWindowMLA  = "sliding_window_mla"
	KindMamba             = "mamba"
)

// manager is how vLLM manages a group's blocks (its single-type manager).
type manager uint8

const (
	managerFull   manager = iota // FullAttentionManager: every block kept
	managerWindow                // SlidingWindowManager: blocks behind the window freed
	managerMamba                 // MambaManager, "align" mode: one state block kept
)

// managerOf returns the manager of kind, or false for a kind the engine
// does not model.
func managerOf(kind string) (manager, bool) {
	switch kind {
	case KindFullAttention, KindMLAAttention, KindSinkFullAttention:
		return managerFull, true
	case KindSlidingWindow, KindSlidingWindowMLA:
		return managerWindow, true
	case KindMamba:
		return managerMamba, true
	}
	return 0, false
}

// Group is one KV-cache group: its kind and, for the sliding-window
// kinds, its window in tokens.
type Group struct {
	Kind          string
	SlidingWindow int
}

// maxGroups bounds a layout (a block records its group in a byte).
const maxGroups = 64

// Layout is a model's KV-cache groups as vLLM builds them: Groups in
// group_idx order, all at the engine's block size. The zero Layout is one
// full-attention group announced as vLLM did before group_idx existed
// (no group fields in the events).
type Layout struct {
	// Name is the preset's name ("" for a custom layout).
	Name   string
	Groups []Group
	// BlockSize is the block size vLLM runs the model with; the engine
	// takes it when Config.BlockSize is 0.
	BlockSize int
}

// groups returns l's groups, the zero Layout's one full-attention group
// included.
func (l Layout) groups() []Group {
	if len(l.Groups) == 0 {
		return []Group{{Kind: KindFullAttention}}
	}
	return l.Groups
}

// announces reports whether the engine's events carry group fields.
func (l Layout) announces() bool { return len(l.Groups) > 0 }

// String names the layout for reports: the preset and its groups.
func (l Layout) String() string {
	if len(l.Groups) == 0 {
		return "one full_attention group"
	}
	var parts []string
	for i := 0; i < len(l.Groups); {
		j := i
		for j < len(l.Groups) && l.Groups[j] == l.Groups[i] {
			j++
		}
		p := fmt.Sprintf("%d %s", j-i, l.Groups[i].Kind)
		if l.Groups[i].SlidingWindow > 0 {
			p += fmt.Sprintf(" (window %d)", l.Groups[i].SlidingWindow)
		}
		parts = append(parts, p)
		i = j
	}
	s := strings.Join(parts, " + ")
	if l.Name != "" {
		s = l.Name + ": " + s
	}
	return s
}

// validate checks every group's kind and window.
func (l Layout) validate() error {
	if len(l.Groups) > maxGroups {
		return fmt.Errorf("%w: %d KV-cache groups (at most %d)", ErrConfig, len(l.Groups), maxGroups)
	}
	for i, g := range l.Groups {
		m, ok := managerOf(g.Kind)
		switch {
		case !ok:
			return fmt.Errorf("%w: group %d: kv_cache_spec_kind %q is not modelled", ErrConfig, i, g.Kind)
		case m == managerWindow && g.SlidingWindow < 2:
			return fmt.Errorf("%w: group %d (%s): sliding window %d, want at least 2 tokens", ErrConfig, i, g.Kind, g.SlidingWindow)
		case m != managerWindow && g.SlidingWindow != 0:
			return fmt.Errorf("%w: group %d (%s) has a sliding window", ErrConfig, i, g.Kind)
		}
	}
	return nil
}

// hasMamba reports whether a group is mamba (chunks then align to blocks).
func (l Layout) hasMamba() bool {
	return slices.ContainsFunc(l.Groups, func(g Group) bool { return g.Kind == KindMamba })
}

// specGroup is vLLM's SpecGroup: the groups of one spec, looked up
// together (a block hits only when every one of them caches it).
type specGroup struct {
	m      manager
	window int
	ids    []int
	full   int // a full-attention spec's run from block 0, once scanned (-1 before)
}

// specGroups returns groups' spec groups in the coordinator's order:
// first appearance, full-attention kinds first (a stable sort).
func specGroups(groups []Group) []specGroup {
	var out []specGroup
	for i, g := range groups {
		k := slices.IndexFunc(out, func(s specGroup) bool { return groups[s.ids[0]] == g })
		if k >= 0 {
			out[k].ids = append(out[k].ids, i)
			continue
		}
		m, _ := managerOf(g.Kind)
		out = append(out, specGroup{m: m, window: g.SlidingWindow, ids: []int{i}, full: -1})
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].m == managerFull && out[b].m != managerFull })
	return out
}

// HybridHit is the prefix hit, in blocks, that vLLM's KV-cache
// coordinator finds for a request whose hit may cover at most maxBlocks
// blocks ((num_tokens-1)/block_size: one token is always computed), where
// held(g, i) reports whether group g caches the request's block i.
//
// Groups of one spec are looked up together: a block counts only when
// each of them holds it. Full attention goes first and takes its longest
// run from block 0. Each other spec may only shorten the candidate
// length L:
//
//   - sliding window of w tokens: the rightmost run of cdiv(w-1, bs)
//     held blocks ending at or before L ends the hit; without one, the
//     run held from block 0.
//   - mamba: the rightmost held block before L ends the hit (its state is
//     the only one needed).
//
// When a spec shortens L every spec is checked again at the new length,
// until none does (with full attention and one other spec one pass
// suffices, as in vLLM; iterating changes nothing). The block size is
// shared, so every hit is block-aligned.
//
// Cost: O(maxBlocks) calls of held per spec and pass.
func HybridHit(groups []Group, bs, maxBlocks int, held func(group, block int) bool) int {
	if maxBlocks <= 0 {
		return 0
	}
	specs := specGroups(groups)
	all := func(s *specGroup, i int) bool {
		for _, g := range s.ids {
			if !held(g, i) {
				return false
			}
		}
		return true
	}
	hit := maxBlocks
	for {
		cur := hit
		for k := range specs {
			s := &specs[k]
			switch s.m {
			case managerFull:
				// Full attention is downward-closed: scanned once, then cut.
				if s.full < 0 {
					s.full = 0
					for s.full < cur && all(s, s.full) {
						s.full++
					}
				}
				cur = min(cur, s.full)
			case managerWindow:
				cur = windowHit(cdiv(s.window-1, bs), cur, func(i int) bool { return all(s, i) })
			case managerMamba:
				cur = mambaHit(cur, func(i int) bool { return all(s, i) })
			}
		}
		if cur >= hit {
			return hit
		}
		hit = cur
	}
}

// windowHit is SlidingWindowManager's hit within limit blocks: scanning
// from the right, the first run of contig held blocks ends the hit; with
// none, the run held from block 0.
func windowHit(contig, limit int, held func(int) bool) int {
	run := 0
	for i := limit - 1; i >= 0; i-- {
		if !held(i) {
			run = 0
			continue
		}
		run++
		if run >= contig {
			return i + run
		}
	}
	return run
}

// mambaHit is MambaManager's hit within limit blocks: up to and including
// the rightmost held block.
func mambaHit(limit int, held func(int) bool) int {
	for i := limit - 1; i >= 0; i-- {
		if held(i) {
			return i + 1
		}
	}
	return 0
}

func cdiv(a, b int) int { return (a + b - 1) / b }

// presets returns kvsim's --model-layout layouts, by name (the package
// doc gives each one's source).
func presets() map[string]Layout {
	window := func(w int) Group { return Group{Kind: KindSlidingWindow, SlidingWindow: w} }
	full := Group{Kind: KindFullAttention}
	mla := Group{Kind: KindMLAAttention}
	return map[string]Layout{
		"llama":       {Name: "llama"},
		"deepseek":    {Name: "deepseek", Groups: []Group{mla}, BlockSize: 64},
		"deepseek-v4": {Name: "deepseek-v4", Groups: []Group{mla}, BlockSize: 256},
		"gemma3":      {Name: "gemma3", Groups: append(slices.Repeat([]Group{window(1024)}, 5), full), BlockSize: 16},
		"gpt-oss":     {Name: "gpt-oss", Groups: []Group{window(128), full}, BlockSize: 16},
		"qwen3-next":  {Name: "qwen3-next", Groups: append(slices.Repeat([]Group{{Kind: KindMamba}}, 3), full), BlockSize: 544},
	}
}

// PresetNames lists the preset layouts, sorted.
func PresetNames() []string { return slices.Sorted(maps.Keys(presets())) }

// Preset returns the named preset layout; "llama" is the zero Layout's
// behaviour.
func Preset(name string) (Layout, error) {
	l, ok := presets()[name]
	if !ok {
		return Layout{}, fmt.Errorf("%w: unknown model layout %q (want one of %s)", ErrConfig, name, strings.Join(PresetNames(), ", "))
	}
	return l, nil
}
