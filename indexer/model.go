package indexer

import "fmt"

// KeyScheme names the content-key function: the root, chaining and
// extra-key encoding of Key. It is mixed into every root, so keys of two
// schemes never meet; a router that computes keys itself can compare it
// with the server's before sending block keys.
const KeyScheme = keyVersion

// NewModel returns a model handle that is not registered with any index,
// for a router that computes block keys on its own side (and sends them
// instead of token ids): it must use the server's block size and
// KeyScheme. Within an index, use Index.AddModel or Index.Model.
func NewModel(name string, blockSize int) (*Model, error) {
	if name == "" {
		return nil, fmt.Errorf("indexer: new model: empty name")
	}
	if blockSize <= 0 {
		return nil, fmt.Errorf("indexer: new model %q: block size %d must be positive", name, blockSize)
	}
	return &Model{Name: name, BlockSize: blockSize, root: RootKey(name, "")}, nil
}

// Keying returns the model's key scheme (KeyScheme).
func (m *Model) Keying() string { return KeyScheme }

// PromptKeys appends to dst the content keys of every full block of
// tokens, as the index keys this model's BlockStored events: the model's
// block size, chained from the root of (model, extras.LoRAName). extras
// may be nil. It is PromptKeys with the name and block size taken from the
// handle, so they cannot disagree with the index's.
//
// Cost: one BlockKey per block (see PromptKeys); allocation-free when dst
// has capacity.
func (m *Model) PromptKeys(tokens []uint32, extras *PromptExtras, dst []Key) []Key {
	return PromptKeys(m.Name, m.BlockSize, tokens, extras, dst)
}
