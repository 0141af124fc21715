package blockmap

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAgainstModel applies random inserts, removals, touches and resets, and checks contents and touch order
// against a map and a slice after each step.
func TestAgainstModel(t *testing.T) {
	for seed := range 20 {
		r := rand.New(rand.NewPCG(uint64(seed), 1))
		var m Map[int]
		model := map[uint64]int{}
		var order []uint64 // least recently touched first
		// Hashes from a small space, some clustered, so probe runs wrap
		// and collide.
		hashOf := func() uint64 {
			if r.IntN(2) == 0 {
				return uint64(r.IntN(64)) << 58
			}
			return uint64(r.IntN(500))
		}
		for step := range 3000 {
			h := hashOf()
			_, in := model[h]
			switch x := r.IntN(10); {
			case x < 5 && !in:
				if s := m.Insert(h, step); m.Hash(s) != h || *m.At(s) != step {
					t.Fatalf("seed %d step %d: Insert returned a wrong slot", seed, step)
				}
				model[h] = step
				order = append(order, h)
			case x < 7 && in:
				s, ok := m.Get(h)
				if !ok || m.Hash(s) != h {
					t.Fatalf("seed %d step %d: Get(%x) = %d, %v", seed, step, h, s, ok)
				}
				m.Delete(s)
				delete(model, h)
				order = slices.DeleteFunc(order, func(x uint64) bool { return x == h })
			case x < 8 && in:
				s, _ := m.Get(h)
				m.Delete(s)
				delete(model, h)
				order = slices.DeleteFunc(order, func(x uint64) bool { return x == h })
			case x < 9 && in:
				s, _ := m.Get(h)
				m.Touch(s)
				order = append(slices.DeleteFunc(order, func(x uint64) bool { return x == h }), h)
			case step%997 == 0:
				m.Reset()
				clear(model)
				order = order[:0]
			}
			if m.Len() != len(model) {
				t.Fatalf("seed %d step %d: Len %d, want %d", seed, step, m.Len(), len(model))
			}
			for h, v := range model {
				s, ok := m.Get(h)
				if !ok || *m.At(s) != v || m.Hash(s) != h {
					t.Fatalf("seed %d step %d: Get(%x) = %d %v", seed, step, h, s, ok)
				}
			}
			var got []uint64
			for s, ok := m.Oldest(); ok; s, ok = m.Next(s) {
				got = append(got, m.Hash(s))
			}
			if !slices.Equal(got, order) {
				t.Fatalf("seed %d step %d: order %x, want %x", seed, step, got, order)
			}
		}
	}
}
