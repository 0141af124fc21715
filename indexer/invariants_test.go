//go:build invariants || race

package indexer

import (
	"strings"
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// mustBreak runs f and checks that it panics through brokenInvariant with
// a message containing want.
func mustBreak(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		msg, _ := r.(string)
		if !strings.HasPrefix(msg, "indexer: broken invariant: ") || !strings.Contains(msg, want) {
			t.Fatalf("panic %v, want a broken invariant about %q", r, want)
		}
	}()
	f()
}

// corrupted is a worker holding blocks 1-8 (one node) and a second
// worker holding blocks 1-4 of the same chain, for a test to corrupt.
func corrupted(t *testing.T) (*Index, *Worker, *node) {
	t.Helper()
	ix, ws := newTestIndex(t, "a", "b")
	apply(t, ws[0], chain(1, 0, 0, 8))
	apply(t, ws[1], chain(1, 0, 0, 4))
	n := ix.head(PromptKeys(testModel, 4, chainTokens(0, 1), nil, nil)[0])
	if n == nil || len(n.keys) != 8 || len(n.segs) != 2 {
		t.Fatalf("setup: node %+v", n)
	}
	return ix, ws[0], n
}

// TestInvariantsCatchCorruption corrupts the tree or an engine map in one
// way at a time and checks that the next batch of the worker panics,
// saying what is broken.
func TestInvariantsCatchCorruption(t *testing.T) {
	touch := func(w *Worker) func() {
		// Names block 8 as a parent: the batch holds the node.
		return func() { apply(t, w, chain(1, 0, 8, 9)) }
	}
	t.Run("equal adjacent segments", func(t *testing.T) {
		_, w, n := corrupted(t)
		n.mu.Lock()
		n.segs[1].set = n.segs[0].set
		n.mu.Unlock()
		mustBreak(t, "have equal sets", touch(w))
	})
	t.Run("segment past the run", func(t *testing.T) {
		_, w, n := corrupted(t)
		n.mu.Lock()
		n.segs[1].start = 100
		n.mu.Unlock()
		mustBreak(t, "past the run", touch(w))
	})
	t.Run("first segment not at 0", func(t *testing.T) {
		_, w, n := corrupted(t)
		n.mu.Lock()
		n.segs[0].start = 1
		n.mu.Unlock()
		mustBreak(t, "do not start at offset 0", touch(w))
	})
	t.Run("first key", func(t *testing.T) {
		_, w, n := corrupted(t)
		n.mu.Lock()
		n.first++
		n.mu.Unlock()
		mustBreak(t, "does not start with the node's first key", touch(w))
	})
	t.Run("unsorted set", func(t *testing.T) {
		_, w, n := corrupted(t)
		n.mu.Lock()
		ents := n.segs[0].set.Entries()
		ents[0], ents[1] = ents[1], ents[0]
		n.mu.Unlock()
		mustBreak(t, "out of order", touch(w))
	})
	t.Run("view disagrees", func(t *testing.T) {
		_, w, n := corrupted(t)
		n.mu.Lock()
		n.view.Load().n.Store(3)
		n.mu.Unlock()
		// Storing block 8 again holds the node without changing it (a
		// change would publish it anew).
		mustBreak(t, "view shows 3 keys", func() { apply(t, w, chain(1, 0, 7, 8)) })
	})
	t.Run("child beyond maxAttach", func(t *testing.T) {
		ix, w, n := corrupted(t)
		// Block 10 branches off block 2 (offset 1): a child node.
		apply(t, w, events.Event{Kind: events.KindBlockStored, BlockSize: 4, HasParent: true, ParentHash: 2,
			BlockHashes: []uint64{10}, TokenIDs: seqTokens(5000, 4)})
		checkInvariants(t, ix)
		n.mu.Lock()
		n.maxAttach = 0
		n.mu.Unlock()
		mustBreak(t, "attaches at 1, maxAttach 0", touch(w))
	})
	t.Run("tree media differ from the engine map", func(t *testing.T) {
		ix, w, n := corrupted(t)
		n.mu.Lock()
		// Worker a holds offsets 4-7 alone; say it holds them on CPU too.
		n.segs[1].set = holders.New([]holders.Entry{holders.MakeEntry(uint32(w.ID()), 1<<events.MediumGPU|1<<events.MediumCPU)})
		n.view.Load().segs[1].set = n.segs[1].set
		n.mu.Unlock()
		_ = ix
		mustBreak(t, "tree has media 000011", touch(w))
	})
	t.Run("engine entry past the run", func(t *testing.T) {
		_, w, _ := corrupted(t)
		slot, _ := w.engine.Get(3) // the batch reads block 8's entry itself
		w.engine.SetVal(slot, w.engine.Val(slot)&^(maxRun-1)|50)
		mustBreak(t, "+50, past the run", touch(w))
	})
	t.Run("resident count", func(t *testing.T) {
		_, w, _ := corrupted(t)
		w.mu.Lock()
		w.res++
		w.mu.Unlock()
		mustBreak(t, "resident counts", touch(w))
	})
	t.Run("alias count", func(t *testing.T) {
		_, w, n := corrupted(t)
		w.mu.Lock()
		w.aliases = map[loc]*alias{{n, 2}: {entries: 2}}
		w.mu.Unlock()
		mustBreak(t, "alias at", touch(w))
	})
	t.Run("retired node still in heads", func(t *testing.T) {
		ix, _, n := corrupted(t)
		n.dead.Store(true)
		mustBreak(t, "still in heads", func() { ix.assertRetired(n) })
	})
}
