package indexer

import (
	"strings"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// TestStaleNodeIDFailsLoudly forges an engine entry that outlived its
// node, whose id the next node took over: using it must panic (a broken
// invariant), not resolve to the new node.
func TestStaleNodeIDFailsLoudly(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	apply(t, w, chain(1, 0, 0, 2))
	slot, _ := w.engine.Get(1)
	stale := w.entry(slot)
	apply(t, w, removed(events.MediumGPU, 2, 1)) // the node dies, its id is freed
	apply(t, w, chain(100, 1, 0, 2))             // a new node takes the id
	fresh := ix.head(PromptKeys(testModel, 4, chainTokens(1, 1), nil, nil)[0])
	if fresh == nil || fresh.id != stale.node() || fresh.gen == stale.gen() {
		t.Fatalf("setup: new node %+v, stale entry %+v", fresh, stale)
	}
	w.mu.Lock()
	w.engine.Insert(1, uint64(stale))
	w.mu.Unlock()
	defer func() {
		msg, _ := recover().(string)
		if !strings.Contains(msg, "broken invariant: stale node id") {
			t.Fatalf("panic %q, want a stale node id", msg)
		}
	}()
	apply(t, w, removed(events.MediumGPU, 1))
	t.Fatal("a removal through a stale node id did not panic")
}
