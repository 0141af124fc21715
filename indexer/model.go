package indexer

import (
	"fmt"
	"slices"
)

// KeyScheme names the content-key function; it is mixed into every root,
// so keys of two schemes never meet, and a router that computes keys can
// compare it with the server's.
const KeyScheme = keyVersion

// NewModel returns a model handle registered with no index, for a router
// that computes block keys itself: it must use the server's block size and
// KeyScheme.
func NewModel(name string, blockSize int) (*Model, error) {
	if name == "" {
		return nil, fmt.Errorf("indexer: new model: empty name")
	}
	if blockSize <= 0 {
		return nil, fmt.Errorf("indexer: new model %q: block size %d must be positive", name, blockSize)
	}
	return newModel(name, blockSize), nil
}

func newModel(name string, blockSize int) *Model {
	m := &Model{Name: name, configured: blockSize, root: RootKey(name, "")}
	m.bs.Store(int32(blockSize))
	return m
}

// BlockSize returns the block size the model's prompts are keyed at: the
// prefix block size most of its workers announce in their events (ties go
// to the configured one, else to the smaller), the configured one until a
// worker announces any. vLLM raises the block size of hybrid models and
// scales it under decode context parallelism, so the configuration is a
// check, not the truth. Cost: one atomic load.
func (m *Model) BlockSize() int { return int(m.bs.Load()) }

// ConfiguredBlockSize returns the block size the model was added with.
func (m *Model) ConfiguredBlockSize() int { return m.configured }

// BlockSizeCount is how many of a model's workers announce a block size.
type BlockSizeCount struct {
	BlockSize, Workers int
}

// LearnedBlockSizes returns the prefix block sizes the model's workers
// announce, with how many announce each, by block size; more than one
// means its workers disagree (Worker.BlockSizeMismatch flags the others).
func (m *Model) LearnedBlockSizes() []BlockSizeCount {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]BlockSizeCount, 0, len(m.sizes))
	for bs, n := range m.sizes {
		out = append(out, BlockSizeCount{BlockSize: bs, Workers: n})
	}
	slices.SortFunc(out, func(a, b BlockSizeCount) int { return a.BlockSize - b.BlockSize })
	return out
}

// noteSize moves a worker's prefix block size from old to now (0: none)
// and chooses the model's block size anew.
func (m *Model) noteSize(old, now int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sizes == nil {
		m.sizes = make(map[int]int)
	}
	if old > 0 {
		if m.sizes[old]--; m.sizes[old] <= 0 {
			delete(m.sizes, old)
		}
	}
	if now > 0 {
		m.sizes[now]++
	}
	best, most := m.configured, 0
	for bs, n := range m.sizes {
		switch {
		case n > most, n == most && bs == m.configured, n == most && best != m.configured && bs < best:
			best, most = bs, n
		}
	}
	m.bs.Store(int32(best))
}

// setPrefixBlockSizeLocked records the worker's prefix block size (0:
// none) with its model.
func (w *Worker) setPrefixBlockSizeLocked(bs int) {
	old := int(w.prefixBS.Load())
	if old == bs {
		return
	}
	w.prefixBS.Store(int32(bs))
	w.model.noteSize(old, bs)
}

// BlockSizeMismatch reports whether the worker's prefix block size, as its
// events announce it, differs from its model's: its blocks are keyed at
// its own size and no prompt keyed at the model's can match them.
func (w *Worker) BlockSizeMismatch() bool {
	bs := int(w.prefixBS.Load())
	return bs != 0 && bs != w.model.BlockSize()
}

// Keying returns the model's key scheme (KeyScheme).
func (m *Model) Keying() string { return KeyScheme }

// PromptKeys is PromptKeys with the model's name and block size.
func (m *Model) PromptKeys(tokens []uint32, extras *PromptExtras, dst []Key) []Key {
	return PromptKeys(m.Name, m.BlockSize(), tokens, extras, dst)
}
