package blockmap

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// check verifies the map's own invariants: entries in one of their two
// buckets, counts per epoch, Len.
func (m *Map) check(t *testing.T) {
	t.Helper()
	var count [epochs]int32
	n := 0
	for i := range m.b {
		for j, meta := range m.b[i].meta {
			h := m.b[i].hash[j]
			if meta == 0 {
				if h != 0 {
					t.Fatalf("empty slot %d has hash %x", i*ways+j, h)
				}
				continue
			}
			n++
			count[meta>>epochShift]++
			b1, b2 := m.buckets(h)
			if b := uint64(i); b != b1 && b != b2 {
				t.Fatalf("entry %x in bucket %d, not in its %d or %d", h, b, b1, b2)
			}
		}
	}
	if n != m.n || count != m.count {
		t.Fatalf("%d entries (Len %d), epoch counts %v, recorded %v", n, m.n, count, m.count)
	}
}

// TestAgainstModel applies random inserts, removals, value changes,
// touches, evictions and resets, with hashes from small and clustered
// spaces, and checks the contents against a map after each step.
func TestAgainstModel(t *testing.T) {
	for seed := range 20 {
		r := rand.New(rand.NewPCG(uint64(seed), 1))
		var m Map
		model := map[uint64]uint64{}
		hashOf := func() uint64 {
			switch r.IntN(3) {
			case 0:
				return uint64(r.IntN(64)) << 58 // clustered high bits
			case 1:
				return uint64(r.IntN(2000)) // sequential
			}
			return r.Uint64() | 1<<63
		}
		var dst []int
		for step := range 6000 {
			h := hashOf()
			_, in := model[h]
			v := uint64(step+1) | uint64(r.IntN(256))<<48
			switch x := r.IntN(20); {
			case x < 10 && !in:
				if s := m.Insert(h, v); m.Hash(s) != h || m.Val(s) != v {
					t.Fatalf("seed %d step %d: Insert returned a wrong slot", seed, step)
				}
				model[h] = v
			case x < 13 && in:
				s, ok := m.Get(h)
				if !ok || m.Hash(s) != h {
					t.Fatalf("seed %d step %d: Get(%x) = %d, %v", seed, step, h, s, ok)
				}
				m.Delete(s)
				delete(model, h)
			case x < 15 && in:
				s, _ := m.Get(h)
				m.SetVal(s, v)
				model[h] = v
			case x < 17 && in:
				s, _ := m.Get(h)
				m.Touch(s)
			case x < 18:
				dst = m.Oldest(r.IntN(5), dst[:0])
				seen := map[int]bool{}
				for _, s := range dst {
					if seen[s] || m.b[s/ways].meta[s%ways] == 0 {
						t.Fatalf("seed %d step %d: Oldest returned slot %d twice or empty", seed, step, s)
					}
					seen[s] = true
					delete(model, m.Hash(s))
				}
				for _, s := range dst {
					m.Delete(s)
				}
			case step%1999 == 0:
				m.Reset()
				clear(model)
			}
			if m.Len() != len(model) {
				t.Fatalf("seed %d step %d: Len %d, want %d", seed, step, m.Len(), len(model))
			}
			if _, ok := m.Get(hashOf()); ok && len(model) == 0 {
				t.Fatalf("seed %d step %d: Get found an entry in an empty map", seed, step)
			}
			if step%100 == 0 || len(model) < 20 {
				for h, v := range model {
					if s, ok := m.Get(h); !ok || m.Val(s) != v || m.Hash(s) != h {
						t.Fatalf("seed %d step %d: Get(%x) = %d %v", seed, step, h, s, ok)
					}
				}
				n := 0
				for s := range m.All() {
					if model[m.Hash(s)] != m.Val(s) {
						t.Fatalf("seed %d step %d: All yields %x=%x", seed, step, m.Hash(s), m.Val(s))
					}
					n++
				}
				if n != len(model) {
					t.Fatalf("seed %d step %d: All yields %d entries, want %d", seed, step, n, len(model))
				}
				m.check(t)
			}
		}
	}
}

// TestOldestIsExactForSmallMaps: under 64 entries and 256 stamps, every
// stamp has an epoch of its own, so Oldest follows the order of stamps
// exactly.
func TestOldestIsExactForSmallMaps(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	for range 50 {
		var m Map
		var order []uint64 // least recently stamped first
		for range 60 + r.IntN(150) {
			if len(order) > 0 && (len(order) >= 60 || r.IntN(3) == 0) {
				h := order[r.IntN(len(order))]
				s, _ := m.Get(h)
				m.Touch(s)
				order = append(slices.DeleteFunc(order, func(x uint64) bool { return x == h }), h)
				continue
			}
			h := r.Uint64()
			m.Insert(h, 1)
			order = append(order, h)
		}
		got := m.Oldest(len(order), nil)
		if len(got) != len(order) {
			t.Fatalf("Oldest returned %d of %d entries", len(got), len(order))
		}
		for i, s := range got {
			if m.Hash(s) != order[i] {
				t.Fatalf("Oldest %d is %x, want %x", i, m.Hash(s), order[i])
			}
		}
	}
}

// TestOldestFollowsStamps: in a large map, what Oldest returns is older
// than what it leaves, to within one epoch (Len/64 stamps), while no entry
// went unstamped for 256 epochs.
func TestOldestFollowsStamps(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	var m Map
	stamp := map[uint64]int{}
	clock := 0
	var hs []uint64
	const n = 5000
	for range n {
		h := r.Uint64()
		m.Insert(h, 1)
		stamp[h] = clock
		clock++
		hs = append(hs, h)
	}
	// Growing from empty wraps the epochs (the first entries, not touched
	// for 256 epochs, merge into one); stamp every entry again so that
	// the rounds start from distinct epochs.
	for _, i := range r.Perm(len(hs)) {
		s, _ := m.Get(hs[i])
		m.Touch(s)
		stamp[hs[i]] = clock
		clock++
	}
	var dst []int
	maxLen := m.Len()
	for round := range 200 {
		// Touch some, insert some, then evict some.
		for range 100 {
			h := hs[r.IntN(len(hs))]
			if s, ok := m.Get(h); ok {
				m.Touch(s)
				stamp[h] = clock
				clock++
			}
		}
		for range 20 {
			h := r.Uint64()
			m.Insert(h, 1)
			stamp[h] = clock
			clock++
			hs = append(hs, h)
		}
		dst = m.Oldest(1+r.IntN(40), dst[:0])
		newest := -1
		for _, s := range dst {
			newest = max(newest, stamp[m.Hash(s)])
		}
		for _, s := range dst {
			delete(stamp, m.Hash(s))
			m.Delete(s)
		}
		oldest := clock
		for _, c := range stamp {
			oldest = min(oldest, c)
		}
		maxLen = max(maxLen, m.Len()+len(dst))
		if slack := max(1, maxLen/epochsSpan) + 1; newest >= oldest+slack {
			t.Fatalf("round %d: returned an entry stamped at %d, left one stamped at %d (slack %d)", round, newest, oldest, slack)
		}
		m.check(t)
	}
}

// TestEpochsWrap stamps far more than 256 epochs' worth while some
// entries are never touched: they stay the oldest.
func TestEpochsWrap(t *testing.T) {
	var m Map
	for h := range uint64(10) {
		m.Insert(h|1<<40, 1) // the ones never touched
	}
	for h := range uint64(100) {
		m.Insert(h|2<<40, 1)
	}
	for i := range 100000 {
		s, _ := m.Get(uint64(i%100) | 2<<40)
		m.Touch(s)
	}
	m.check(t)
	for _, s := range m.Oldest(10, nil) {
		if m.Hash(s)>>40 != 1 {
			t.Fatalf("Oldest returned %x, touched since the untouched ones were stored", m.Hash(s))
		}
	}
}

// TestReserve checks that a map with room reserved for n entries takes
// them without growing, keeps what it held, and that reserving less than
// it has room for changes nothing.
func TestReserve(t *testing.T) {
	var m Map
	for h := uint64(1); h <= 100; h++ {
		m.Insert(h, h)
	}
	const n = 100000
	m.Reserve(n)
	nb := m.nb
	m.Reserve(10)
	if m.nb != nb {
		t.Fatalf("Reserve(10) changed the table from %d to %d buckets", nb, m.nb)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for m.Len() < n {
		h := r.Uint64()
		if _, ok := m.Get(h); !ok {
			m.Insert(h, h&valueMask|1)
		}
	}
	if m.nb != nb {
		t.Fatalf("%d inserts after Reserve(%d) grew the table from %d to %d buckets", n-100, n, nb, m.nb)
	}
	if full := float64(m.Len()) / float64(len(m.b)*ways); full < 0.85 {
		t.Fatalf("the reserved table is %.2f full at %d entries", full, n)
	}
	for h := uint64(1); h <= 100; h++ {
		if i, ok := m.Get(h); !ok || m.Val(i) != h {
			t.Fatalf("entry %d lost by Reserve", h)
		}
	}
	m.check(t)
}

// TestInsertAgedReproducesRecency copies a map whose entries span many
// epochs (some ancient) into a fresh one with InsertAged and Age, in
// table order: every entry keeps its age, and evicting the whole copy
// with Oldest yields the entries in the original's order of epochs.
func TestInsertAgedReproducesRecency(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	var src Map
	var hs []uint64
	for range 3000 {
		h := r.Uint64()
		src.Insert(h, h&valueMask|1)
		hs = append(hs, h)
	}
	// Touch a tenth of them over and over, so that the rest go ancient
	// and the touched ones spread over the ring.
	for i := range 40000 {
		s, _ := src.Get(hs[(i*7)%300])
		src.Touch(s)
	}
	ages := map[uint64]uint8{}
	var dst Map
	// The destination's epoch is not the source's: ages, not epochs, are
	// what carry over.
	for range 5 {
		dst.Insert(1, 1)
		s, _ := dst.Get(1)
		dst.Delete(s)
	}
	sawAncient := false
	for s := range src.All() {
		h := src.Hash(s)
		ages[h] = src.Age(s)
		sawAncient = sawAncient || ages[h] == Ancient
		dst.InsertAged(h, src.Val(s), ages[h])
	}
	if !sawAncient {
		t.Fatal("setup: no ancient entries")
	}
	dst.check(t)
	for s := range dst.All() {
		if h := dst.Hash(s); dst.Age(s) != ages[h] || dst.Val(s) != h&valueMask|1 {
			t.Fatalf("entry %x: age %d value %x, want age %d value %x", h, dst.Age(s), dst.Val(s), ages[h], h&valueMask|1)
		}
	}
	// rank orders ages as Oldest does: ancient first, then by age.
	rank := func(a uint8) int {
		if a == Ancient {
			return 1 << 10
		}
		return int(a)
	}
	prev := 1 << 11
	for dst.Len() > 0 {
		out := dst.Oldest(64, nil)
		for _, s := range out {
			a := rank(ages[dst.Hash(s)])
			if a > prev {
				t.Fatalf("Oldest returned an entry of age %d after one of age %d", a, prev)
			}
			prev = a
		}
		for _, s := range out {
			dst.Delete(s)
		}
	}
}

// TestWarmChangesNothing: Warm only reads; every entry keeps its slot and
// value, and an empty map answers 0.
func TestWarmChangesNothing(t *testing.T) {
	var m Map
	if m.Warm(42) != 0 {
		t.Fatal("Warm of an empty map read something")
	}
	slots := map[uint64]int{}
	for h := uint64(1); h <= 1000; h++ {
		m.Insert(h*0x9e3779b97f4a7c15, h)
	}
	for h := uint64(1); h <= 1000; h++ {
		slots[h], _ = m.Get(h * 0x9e3779b97f4a7c15)
	}
	for h := uint64(1); h <= 2000; h++ {
		m.Warm(h * 0x9e3779b97f4a7c15)
	}
	if m.Len() != 1000 {
		t.Fatalf("len %d after Warm", m.Len())
	}
	for h, want := range slots {
		i, ok := m.Get(h * 0x9e3779b97f4a7c15)
		if !ok || i != want || m.Val(i) != h {
			t.Fatalf("hash %d: slot %d ok %v value %d, want slot %d value %d", h, i, ok, m.Val(i), want, h)
		}
	}
	m.check(t)
}

// TestReserveGrown: a table reserved as grown holds its n entries at
// about the load a growth leaves, and does not grow while they go in.
func TestReserveGrown(t *testing.T) {
	var m Map
	const n = 30000
	m.ReserveGrown(n)
	slots := len(m.b) * ways
	for h := uint64(1); h <= n; h++ {
		m.Insert(h*0x9e3779b97f4a7c15, h)
	}
	if len(m.b)*ways != slots {
		t.Fatalf("the table grew from %d to %d slots while its reserved entries went in", slots, len(m.b)*ways)
	}
	if load := float64(n) / float64(slots); load < 0.80 || load > 0.86 {
		t.Fatalf("load %.3f with %d entries in %d slots, want about 0.83", load, n, slots)
	}
	m.check(t)
}
