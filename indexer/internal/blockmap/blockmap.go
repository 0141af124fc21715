// Package blockmap is a worker's engine-block map: engine block hash to a
// small value, with the entries linked in the order they were last touched
// so that the least recently touched one can be evicted in O(1).
//
// It is golang-lru's simplelru reduced to what a worker needs, laid out to
// cost less: entries live by value in one slab and link to each other by
// 32-bit slab index (an intrusive list), and the hash index is a
// map[uint64]uint32. golang-lru/v2 v2.0.7 allocates one list element per
// entry (value, key, two links, the list pointer, an expiry time and bucket)
// and indexes it with a map of pointers; for the index's 24-byte value that
// measured 167 bytes and 1 allocation per entry and 138 ns per
// insert-evict cycle, against 56 bytes, 0 allocations and 57 ns here
// (BenchmarkLRU in this package; numbers in docs/benchmarks.md).
//
// A Map is not safe for concurrent use; the indexer guards each worker's
// with the worker's mutex.
package blockmap

// Map maps engine block hashes to values of type V in touch order.
type Map[V any] struct {
	index map[uint64]uint32
	// slab[0] is the sentinel of the circular touch-order list: its next
	// is the least recently touched entry, its prev the most recent.
	slab []entry[V]
	free uint32 // head of the free-slot list through next, 0 when none
}

type entry[V any] struct {
	hash       uint64
	prev, next uint32
	val        V
}

// freeMark is the prev of a free slot.
const freeMark = ^uint32(0)

// Len returns the number of entries.
func (m *Map[V]) Len() int { return len(m.index) }

func (m *Map[V]) init() {
	if m.slab == nil {
		m.index = make(map[uint64]uint32)
		m.slab = make([]entry[V], 1, 64)
	}
}

// Get returns the slot of hash h. Cost: one map probe.
func (m *Map[V]) Get(h uint64) (uint32, bool) {
	i, ok := m.index[h]
	return i, ok
}

// At returns the value in slot i. The pointer is valid until the next
// Insert, which may move the slab.
func (m *Map[V]) At(i uint32) *V { return &m.slab[i].val }

// Hash returns the hash of the entry in slot i.
func (m *Map[V]) Hash(i uint32) uint64 { return m.slab[i].hash }

// Insert adds hash h, which must be absent, with value v as the most
// recently touched entry, and returns its slot. Cost: one map insert;
// amortised O(1) slab growth, no other allocation.
func (m *Map[V]) Insert(h uint64, v V) uint32 {
	m.init()
	var i uint32
	if m.free != 0 {
		i = m.free
		m.free = m.slab[i].next
	} else {
		m.slab = append(m.slab, entry[V]{})
		i = uint32(len(m.slab) - 1)
	}
	m.slab[i] = entry[V]{hash: h, val: v}
	m.linkNewest(i)
	m.index[h] = i
	return i
}

// Delete removes the entry in slot i.
func (m *Map[V]) Delete(i uint32) {
	e := &m.slab[i]
	delete(m.index, e.hash)
	m.unlink(i)
	var zero V
	e.val = zero
	e.prev, e.next = freeMark, m.free
	m.free = i
}

// Touch makes the entry in slot i the most recently touched. Cost: O(1).
func (m *Map[V]) Touch(i uint32) {
	if m.slab[0].prev == i {
		return
	}
	m.unlink(i)
	m.linkNewest(i)
}

// Oldest returns the slot of the least recently touched entry.
func (m *Map[V]) Oldest() (uint32, bool) {
	if len(m.index) == 0 {
		return 0, false
	}
	return m.slab[0].next, true
}

// Next returns the slot touched after slot i, for iterating from Oldest;
// ok is false after the newest.
func (m *Map[V]) Next(i uint32) (uint32, bool) {
	n := m.slab[i].next
	return n, n != 0
}

// Reset removes every entry and releases the memory.
func (m *Map[V]) Reset() { *m = Map[V]{} }

func (m *Map[V]) unlink(i uint32) {
	e := &m.slab[i]
	m.slab[e.prev].next = e.next
	m.slab[e.next].prev = e.prev
}

func (m *Map[V]) linkNewest(i uint32) {
	last := m.slab[0].prev
	m.slab[i].prev, m.slab[i].next = last, 0
	m.slab[last].next = i
	m.slab[0].prev = i
}
