package holders

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// singles interns one-worker sets, as the indexer does.
type singles map[Entry]*Set

func (s singles) get(w uint32, m uint8) *Set {
	e := MakeEntry(w, m)
	if s[e] == nil {
		s[e] = New([]Entry{e})
	}
	return s[e]
}

// TestApplyAgainstModel applies random ops to random sets and checks the
// result against a map model: contents, sortedness, nil for empty,
// interned singletons, the same pointer when nothing changes, and that
// the input set is never modified.
func TestApplyAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sg := singles{}
	var s *Set
	model := map[uint32]uint8{}
	for step := range 20000 {
		// Two draws ANDed: sparser masks than one draw.
		set, clr := uint8(r.IntN(64)), uint8(r.IntN(64))
		set &= uint8(r.IntN(64))
		clr &= uint8(r.IntN(64))
		op := Op{Worker: uint32(r.IntN(12)), Set: set, Clear: clr}
		before := slices.Clone(s.Entries())
		got := op.Apply(s, sg.get)
		if !slices.Equal(s.Entries(), before) {
			t.Fatalf("step %d: Apply modified its input", step)
		}
		old := model[op.Worker]
		if m := old&^op.Clear | op.Set; m == 0 {
			delete(model, op.Worker)
		} else {
			model[op.Worker] = m
		}
		var want []Entry
		for w, m := range model {
			want = append(want, MakeEntry(w, m))
		}
		slices.Sort(want)
		if !slices.Equal(got.Entries(), want) {
			t.Fatalf("step %d: %+v applied to %v = %v, want %v", step, op, before, got.Entries(), want)
		}
		switch {
		case len(want) == 0 && got != nil:
			t.Fatalf("step %d: empty set is not nil", step)
		case len(want) == 1 && got != sg.get(want[0].Worker(), want[0].Media()):
			t.Fatalf("step %d: one-worker set is not the interned one", step)
		case slices.Equal(before, want) && got != s:
			t.Fatalf("step %d: unchanged set is a new pointer", step)
		}
		for w := range uint32(12) {
			if got.Media(w) != model[w] {
				t.Fatalf("step %d: Media(%d) = %b, want %b", step, w, got.Media(w), model[w])
			}
		}
		if !Equal(got, New(want)) || len(want) > 0 && Equal(got, New(want[1:])) {
			t.Fatalf("step %d: Equal", step)
		}
		s = got
		if r.IntN(50) == 0 {
			s, model = nil, map[uint32]uint8{}
		}
	}
}
