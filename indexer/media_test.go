package indexer

import (
	"errors"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// Every tier class is stored, offloaded to and removed from as GPU is, OTHER
// (a medium name no table knows) included: no error, nothing invalid, and
// Match and Stats count each class apart. Only a value that is no Medium
// is refused.
func TestEveryTierApplies(t *testing.T) {
	for m := range events.Medium(events.NumMedia) {
		ix, ws := newTestIndex(t, "a")
		w := ws[0]
		st := stored(0, false, []uint64{1, 2}, seqTokens(0, 8))
		st.Medium, st.MediumName = m, "name-"+m.String()
		if err := apply(t, w, st); err != nil {
			t.Fatalf("%v: store: %v", m, err)
		}
		got := matchOf(ix, seqTokens(0, 8), nil, w)
		if got.Blocks != 2 || got.ByMedium[m] != 2 {
			t.Fatalf("%v: match %+v, want 2 blocks in %v", m, got, m)
		}
		// Offload block 1 to every other class too.
		for o := range events.Medium(events.NumMedia) {
			if o != m {
				if err := apply(t, w, events.Event{Kind: events.KindBlockStored, BlockHashes: []uint64{1}, Medium: o}); err != nil {
					t.Fatalf("%v: offload to %v: %v", m, o, err)
				}
			}
		}
		s := w.Stats()
		for o := range events.Medium(events.NumMedia) {
			want := int64(1)
			if o == m {
				want = 2
			}
			if s.ResidentByMedium[o] != want {
				t.Errorf("%v: resident in %v = %d, want %d", m, o, s.ResidentByMedium[o], want)
			}
		}
		if err := apply(t, w, removed(m, 1, 2)); err != nil {
			t.Fatalf("%v: remove: %v", m, err)
		}
		got = matchOf(ix, seqTokens(0, 8), nil, w)
		if got.Blocks != 1 || got.ByMedium[m] != 0 {
			t.Errorf("%v: after the removal match %+v, want block 1 held in the other classes only", m, got)
		}
		if s := w.Stats(); s.InvalidEvents != 0 || s.ResidentBlocks != 1 {
			t.Errorf("%v: stats %+v", m, s)
		}
	}
	_, ws := newTestIndex(t, "a")
	bad := stored(0, false, []uint64{1}, seqTokens(0, 4))
	bad.Medium = events.Medium(events.NumMedia)
	if err := apply(t, ws[0], bad); !errors.Is(err, ErrUnknownMedium) || ws[0].Stats().InvalidEvents != 1 {
		t.Errorf("a medium out of range: %v, invalid %d", err, ws[0].Stats().InvalidEvents)
	}
}
