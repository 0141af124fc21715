package indexer

import "fmt"

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
	return &Model{Name: name, BlockSize: blockSize, root: RootKey(name, "")}, nil
}

// Keying returns the model's key scheme (KeyScheme).
func (m *Model) Keying() string { return KeyScheme }

// PromptKeys is PromptKeys with the model's name and block size.
func (m *Model) PromptKeys(tokens []uint32, extras *PromptExtras, dst []Key) []Key {
	return PromptKeys(m.Name, m.BlockSize, tokens, extras, dst)
}
