package engine

import (
	"fmt"
	"slices"

	"github.com/kvindex/kvindex/events"
)

// groupBlocks is a request's blocks in one KV-cache group (vLLM's
// req_to_blocks and num_cached_block of its single-type manager).
type groupBlocks struct {
	// blocks holds a block per token position from 0; none is vLLM's null
	// block: a position the group skips (behind a window, or a mamba
	// state not kept).
	blocks []int32
	// stored is the leading positions cached (hit, or stored by the
	// request).
	stored int
	// lastState (mamba) is the position of the state block the previous
	// allocation left, freed once the next is computed (none: no such).
	lastState int
}

// peakBlocks bounds the blocks a request of tokens tokens holds at once
// in a group of g's kind: every position (full attention), the window
// plus a step's chunk and two partial blocks (sliding window), the state
// kept and the one being computed (mamba).
func (e *Engine) peakBlocks(g Group, tokens int) int {
	bs, all := e.cfg.BlockSize, blocksFor(tokens, e.cfg.BlockSize)
	switch m, _ := managerOf(g.Kind); m {
	case managerWindow:
		return min(all, cdiv(e.cfg.MaxBatchedTokens+g.SlidingWindow-1, bs)+2)
	case managerMamba:
		return min(all, 2)
	}
	return all
}

// alignSplit is vLLM's _mamba_block_aligned_split: while s prefills (its
// prompt, or a preempted request's whole sequence) from computed tokens,
// a chunk of need tokens is cut to whole blocks, or to end at the last
// block boundary of the sequence; the tail after it goes alone. 0: no
// aligned chunk fits.
func (e *Engine) alignSplit(s *seq, computed, need int) int {
	n := s.target()
	if computed >= max(s.req.PromptLen, n-1) {
		return need // decoding
	}
	bs := e.cfg.BlockSize
	last := n - n%bs
	switch after := computed + need; {
	case after < last:
		return need / bs * bs
	case computed < last && last < after:
		return last - computed
	}
	return need
}

// hitFrom is the first position of a hit of hit blocks that group g
// holds (vLLM's skipped blocks of a new request: positions before it are
// null): 0 for full attention, the window's first block for a sliding
// window, the state block for mamba.
func (e *Engine) hitFrom(g, hit int) int {
	switch m, _ := managerOf(e.groups[g].Kind); m {
	case managerWindow:
		return max(0, hit*e.cfg.BlockSize-e.groups[g].SlidingWindow+1) / e.cfg.BlockSize
	case managerMamba:
		return max(hit-1, 0)
	}
	return 0
}

// admitBlocks is how many free blocks admitting s with a hit of hit
// blocks and tokens tokens scheduled takes: each group's new blocks plus
// the hit blocks it takes off the free queue (vLLM's
// get_num_blocks_to_allocate).
func (e *Engine) admitBlocks(s *seq, hit, tokens int) int {
	n := 0
	for g := range e.groups {
		from := e.hitFrom(g, hit)
		for i := from; i < hit; i++ {
			if b := e.p.lookup(blockKey(s.hashes[i], g)); e.p.blocks[b].ref == 0 {
				n++
			}
		}
		switch m, _ := managerOf(e.groups[g].Kind); {
		case m == managerMamba && blocksFor(tokens, e.cfg.BlockSize) > hit:
			n++
		case m != managerMamba:
			n += blocksFor(tokens, e.cfg.BlockSize) - hit
		}
	}
	return n
}

// touchHit gives s the hit's blocks in every group, null before hitFrom
// (vLLM's allocate_new_computed_blocks); all groups are touched before
// any allocates.
func (e *Engine) touchHit(s *seq, hit int) {
	for g := range e.groups {
		gb := &s.g[g]
		*gb = groupBlocks{blocks: gb.blocks[:0], stored: hit, lastState: none}
		from := e.hitFrom(g, hit)
		for range from {
			gb.blocks = append(gb.blocks, none)
		}
		for i := from; i < hit; i++ {
			b := e.p.lookup(blockKey(s.hashes[i], g))
			if b == none {
				panic(fmt.Sprintf("engine %d: group %d lost hit block %d between lookup and admission", e.id, g, i))
			}
			e.p.touch(b)
			gb.blocks = append(gb.blocks, b)
		}
	}
}

// removeSkipped frees the blocks of s in group g that its computed
// tokens no longer need, replacing them with null (vLLM's
// remove_skipped_blocks): a sliding window's positions wholly before the
// window of the next token, a mamba group's every state but the last
// computed. Positions are freed from the highest down, stopping at a
// null; for mamba, then the previous state block.
func (e *Engine) removeSkipped(s *seq, g int) {
	m, _ := managerOf(e.groups[g].Kind)
	if m == managerFull {
		return
	}
	gb := &s.g[g]
	skipped := s.computed - 1 // mamba keeps only the last token's state
	if m == managerWindow {
		skipped = s.computed - e.groups[g].SlidingWindow + 1
	}
	if skipped > 0 {
		for i := min(skipped/e.cfg.BlockSize, len(gb.blocks)) - 1; i >= 0 && gb.blocks[i] != none; i-- {
			e.p.release(gb.blocks[i])
			gb.blocks[i] = none
		}
	}
	if m == managerMamba && gb.lastState >= 0 && gb.lastState < blocksFor(s.computed, e.cfg.BlockSize)-1 && gb.blocks[gb.lastState] != none {
		e.p.release(gb.blocks[gb.lastState])
		gb.blocks[gb.lastState] = none
	}
}

// newBlocks is how many blocks s needs in group g to hold tokens tokens:
// a block per new position, or for mamba one state block when the
// sequence reaches a new position.
func (e *Engine) newBlocks(s *seq, g, tokens int) int {
	more := blocksFor(tokens, e.cfg.BlockSize) - len(s.g[g].blocks)
	if more <= 0 {
		return 0
	}
	if e.groups[g].Kind == KindMamba {
		return 1
	}
	return more
}

// allocate gives s the blocks newBlocks counted in group g. Mamba (align
// mode) nulls the positions up to the last and takes one block there,
// remembering the previous state block.
func (e *Engine) allocate(s *seq, g, tokens int) {
	gb := &s.g[g]
	want := blocksFor(tokens, e.cfg.BlockSize)
	if want <= len(gb.blocks) {
		return
	}
	if e.groups[g].Kind == KindMamba {
		gb.lastState = none
		if len(gb.blocks) > 0 {
			gb.lastState = len(gb.blocks) - 1
		}
		for len(gb.blocks) < want-1 {
			gb.blocks = append(gb.blocks, none)
		}
	}
	for len(gb.blocks) < want {
		gb.blocks = append(gb.blocks, e.p.allocate())
	}
}

// cacheFull caches, in every group in order, the blocks of s the
// scheduled chunk fills, and announces each group's in one BlockStored
// (vLLM's cache_full_blocks: null positions skipped, their tokens still
// in token_ids, the parent the hash before the first new position).
func (e *Engine) cacheFull(s *seq) {
	bs := e.cfg.BlockSize
	full := min((s.computed+s.chunk)/bs, len(s.hashes))
	var toks []uint32 // the last event's token_ids, shared by groups storing the same positions
	tokFrom := -1
	for g := range e.groups {
		gb := &s.g[g]
		if full <= gb.stored {
			continue
		}
		hashes := s.hashes[gb.stored:full:full]
		if e.cfg.Events && slices.Contains(gb.blocks[gb.stored:full], none) {
			start := len(e.evHash)
			for k := gb.stored; k < full; k++ {
				if gb.blocks[k] != none {
					e.evHash = append(e.evHash, s.hashes[k])
				}
			}
			hashes = e.evHash[start:len(e.evHash):len(e.evHash)]
		}
		for k := gb.stored; k < full; k++ {
			if gb.blocks[k] != none {
				e.p.cache(gb.blocks[k], s.hashes[k], g)
			}
		}
		if e.cfg.Events {
			if gb.stored != tokFrom {
				start := len(e.evToks)
				e.evToks = s.req.AppendSequenceTokens(e.evToks, s.out, gb.stored*bs, full*bs)
				toks, tokFrom = e.evToks[start:len(e.evToks):len(e.evToks)], gb.stored
			}
			e.evs = append(e.evs, e.storedEvent(s, g, hashes, toks))
		}
		gb.stored = full
	}
}

// storedEvent is group g's BlockStored of hashes over toks for s, with
// the group's fields when the layout announces them.
func (e *Engine) storedEvent(s *seq, g int, hashes []uint64, toks []uint32) events.Event {
	gb := &s.g[g]
	ev := events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: toks, BlockSize: e.cfg.BlockSize, MediumName: "GPU"}
	if gb.stored > 0 {
		ev.ParentHash, ev.HasParent = s.hashes[gb.stored-1], true
	}
	if e.cfg.Layout.announces() {
		grp := e.groups[g]
		ev.GroupIdx, ev.HasGroupIdx, ev.SpecKind = g, true, grp.Kind
		if m, _ := managerOf(grp.Kind); m == managerWindow {
			ev.SlidingWindow, ev.HasSlidingWindow = grp.SlidingWindow, true
		}
	}
	return ev
}
