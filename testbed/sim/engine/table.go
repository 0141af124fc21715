package engine

// table maps block hashes to block indices: open addressing with linear
// probing and backward-shift deletion, so that a prefix cache's constant
// insert/delete churn leaves no tombstones (which slowed Go's map), at a
// load factor <= 1/2. Keys are mixed hashes: their low bits index it.
type table struct {
	slots []slot
	mask  uint64
	n     int
}

type slot struct {
	key uint64
	val int32 // none marks an empty slot
}

// newTable returns a table for at most maxEntries entries.
func newTable(maxEntries int) *table {
	size := 16
	for size < 2*maxEntries {
		size <<= 1
	}
	t := &table{slots: make([]slot, size), mask: uint64(size - 1)}
	for i := range t.slots {
		t.slots[i].val = none
	}
	return t
}

// get returns the value for k, or none.
func (t *table) get(k uint64) int32 {
	for i := k & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.val == none || s.key == k {
			return s.val
		}
	}
}

// set stores v for k. The table must have room (entries < size/2 by
// construction: at most one entry per block).
func (t *table) set(k uint64, v int32) {
	for i := k & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.val == none {
			s.key, s.val = k, v
			t.n++
			return
		}
		if s.key == k {
			s.val = v
			return
		}
	}
}

// del removes k, shifting later entries of its probe run back so that no
// lookup ever needs a tombstone.
func (t *table) del(k uint64) {
	i := k & t.mask
	for {
		if t.slots[i].val == none {
			return
		}
		if t.slots[i].key == k {
			break
		}
		i = (i + 1) & t.mask
	}
	t.n--
	for j := (i + 1) & t.mask; t.slots[j].val != none; j = (j + 1) & t.mask {
		home := t.slots[j].key & t.mask
		// Move the entry at j into the hole at i when its home slot does
		// not lie cyclically in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i].val = none
}

// len is the number of entries.
func (t *table) len() int { return t.n }
