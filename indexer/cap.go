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
// side group that lowered it last (of several of one description, which
// vLLM looks up together, the first), -1 when none did.
//
// Cost: a flag load for a worker without side groups; else, per
// description of side groups (sideSpec) and pass, a map probe per block
// looked at: a window group's window when it is held, else back from the
// cut to the first window it holds (BenchmarkScoreHybrid).
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
		// Groups of no block size yet hold nothing and are in no spec.
		for _, sp := range w.side.specs {
			bs := sp.blockSize
			keys := keysAt(bs)
			nb := min(tokens/bs, len(keys))
			if t := sp.accept(keys, nb) * bs; t < tokens {
				tokens, capper, changed = t, sp.members[0].g.Index, true
			}
		}
	}
	return tokens, capper
}

// accept returns the most blocks, at most nb, that the spec's hit rule
// accepts for keys. Callers hold side.mu (shared).
func (sp *sideSpec) accept(keys []Key, nb int) int {
	switch sp.class {
	case ClassWindow:
		need, run := max((sp.window-1+sp.blockSize-1)/sp.blockSize, 1), 0
		for i := nb - 1; i >= 0; i-- {
			if !sp.has(keys[i]) {
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
			if sp.has(keys[i]) {
				return i + 1
			}
		}
		return 0
	default: // ClassPrefix
		i := 0
		for i < nb && sp.has(keys[i]) {
			i++
		}
		return i
	}
}
