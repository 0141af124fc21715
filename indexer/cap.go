package indexer

// HasSideGroups reports whether the worker has a side group, so Cap may
// lower its hits. Cost: one atomic load.
func (w *Worker) HasSideGroups() bool { return w.capped.Load() }

// KeysAt gives a prompt's content keys at a block size, for Cap; nil when
// it cannot (a prompt given as keys of another block size).
type KeysAt func(blockSize int) []Key

// Cap returns the hit vLLM's coordinator would realize on the worker for
// a prompt whose prefix group (the anchor) holds prefixTokens from the
// first token, at most maxTokens: the longest length every side group
// accepts (window groups the blocks of their window before the cut, mamba
// groups the block at the cut, other prefix groups every block), found as
// vLLM finds it, by lowering the length until all accept. capper is the
// side group that lowered it last, -1 when none did.
//
// Cost: a flag load for a worker without side groups; else, per side
// group and pass, a map probe per block looked at: a window group's
// window when it is held, else back from the cut to the first window it
// holds (BenchmarkScoreHybrid).
func (w *Worker) Cap(prefixTokens, maxTokens int, keysAt KeysAt) (tokens, capper int) {
	tokens, capper = min(prefixTokens, maxTokens), -1
	if !w.capped.Load() || tokens <= 0 {
		return tokens, capper
	}
	anchorBS := int(w.prefixBS.Load())
	w.side.mu.RLock()
	defer w.side.mu.RUnlock()
	for changed := true; changed && tokens > 0; {
		changed = false
		if anchorBS > 0 {
			tokens -= tokens % anchorBS
		}
		for _, sg := range w.side.order {
			bs := sg.g.BlockSize
			if bs <= 0 {
				continue // nothing stored yet: it holds nothing, and caps when it does
			}
			keys := keysAt(bs)
			nb := min(tokens/bs, len(keys))
			if t := sg.accept(keys, nb) * bs; t < tokens {
				tokens, capper, changed = t, sg.g.Index, true
			}
		}
	}
	return tokens, capper
}

// accept returns the most blocks, at most nb, that the group's hit rule
// accepts for keys. Callers hold side.mu (shared).
func (sg *sideGroup) accept(keys []Key, nb int) int {
	switch sg.g.Class {
	case ClassWindow:
		need, run := sg.g.windowBlocks(), 0
		for i := nb - 1; i >= 0; i-- {
			if sg.held[keys[i]] == 0 {
				run = 0
				continue
			}
			if run++; run >= need {
				return i + need
			}
		}
		return run // the run from the first block, shorter than the window
	case ClassMamba:
		for i := nb - 1; i >= 0; i-- {
			if sg.held[keys[i]] != 0 {
				return i + 1
			}
		}
		return 0
	default: // ClassPrefix
		i := 0
		for i < nb && sg.held[keys[i]] != 0 {
			i++
		}
		return i
	}
}
