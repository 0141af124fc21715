// Package blockmap is a worker's engine-block map: engine block hash to a
// small value, with the entries linked in the order they were last touched
// so that the least recently touched one can be evicted in O(1).
//
// It is golang-lru's simplelru reduced to what a worker needs and laid out
// for the cache. Entries (hash, value, two list links) live in a slab and
// link to each other by slot number (an intrusive list); freed slots are
// reused last-in first-out, so an insert writes to an entry a removal has
// just touched. The hash index is open addressing over a control byte
// (empty, deleted, or 7 bits of the hash) and a 4-byte slot number per
// position: 640 KB for a 100 k-block worker, which stays in L2, so a
// lookup misses the cache about once (on the entry) and an insert not at
// all. Deletion leaves a tombstone in the index; slots never move.
//
// Measured with BenchmarkLRU (this package: 80 k entries; per block a
// lookup of the new hash, its insert, a touch of its parent, and later the
// lookup and removal of the block; same run, on the project's 2-core
// benchmark machine, a Xeon under KVM, Go 1.26), and bytes per entry at
// 1 Mi entries:
//
//	                                          ns/block  allocs  bytes/entry
//	golang-lru/v2 v2.0.7 simplelru              280       1       132
//	map[uint64]uint32 index + slab list          80       0        65
//	entries inline behind control bytes          60       0        82
//	this layout                                  58       0        51
//
// with a 24-byte value holding a pointer (the indexer's entry then). With
// its current entry (16 bytes, no pointer), in one later run: golang-lru
// 296 ns, 1 allocation, 116 bytes per entry; this layout 61 ns, none, 48.
// golang-lru allocates an element per entry (key, value, two links, the
// list, an expiry time) behind a map of pointers. In the indexer's
// BenchmarkMemory10M (10 k blocks per worker) this layout costs 42 bytes
// per block.
//
// A Map is not safe for concurrent use; the indexer guards each worker's
// with the worker's mutex.
package blockmap

import "math/bits"

// Map maps engine block hashes to values of type V in touch order.
type Map[V any] struct {
	// The index: a control byte (empty, deleted, or 0x80 | 7 bits of the
	// hash) and a slab slot per position, open addressing with linear
	// probing, at most 3/4 full of entries and tombstones. (Tombstones do
	// not end a probe, so a lookup of an absent hash, which every stored
	// block makes, walks further as they pile up: at 7/8 BenchmarkApply
	// in the indexer measured 8% slower.)
	ctrl  []uint8
	idx   []uint32
	shift uint // 64 - log2(len(ctrl))
	n     int  // live entries
	dead  int  // tombstones
	// slab holds the entries; free slots form a stack through next, so an
	// insert reuses the slot a removal has just touched.
	slab []entry[V]
	free uint32
	// head and tail are the least and most recently touched entries.
	head, tail uint32
}

type entry[V any] struct {
	hash       uint64
	prev, next uint32
	val        V
}

const (
	ctrlEmpty   = 0
	ctrlDeleted = 1
	nilSlot     = ^uint32(0)
	minTable    = 16
)

// tag is hash h's control byte.
func tag(h uint64) uint8 { return 0x80 | uint8(h>>57) }

// home is the position where hash h's probe sequence starts: Fibonacci
// hashing of h (engine hashes are uniform already; the multiply guards
// against sequential ones).
func (m *Map[V]) home(h uint64) int {
	return int((h ^ h>>31) * 0x9e3779b97f4a7c15 >> m.shift)
}

// Len returns the number of entries.
func (m *Map[V]) Len() int { return m.n }

// Get returns the slot of hash h. Cost: a scan of control bytes and slot
// indices (which stay in L2), and one entry per tag match (1 in 128 for
// another hash): about one cache miss.
func (m *Map[V]) Get(h uint64) (uint32, bool) {
	if m.n == 0 {
		return 0, false
	}
	t := tag(h)
	mask := len(m.ctrl) - 1
	for i := m.home(h); ; i = (i + 1) & mask {
		switch c := m.ctrl[i]; {
		case c == ctrlEmpty:
			return 0, false
		case c == t:
			if s := m.idx[i]; m.slab[s].hash == h {
				return s, true
			}
		}
	}
}

// At returns the value in slot i. The pointer is valid until the next
// Insert, which may move the slab; slot numbers stay valid until Delete.
func (m *Map[V]) At(i uint32) *V { return &m.slab[i].val }

// Hash returns the hash of the entry in slot i.
func (m *Map[V]) Hash(i uint32) uint64 { return m.slab[i].hash }

// Insert adds hash h, which must be absent, with value v as the most
// recently touched entry, and returns its slot. Cost: a probe of the
// index; no allocation but amortised growth.
func (m *Map[V]) Insert(h uint64, v V) uint32 {
	if (m.n+m.dead+1)*4 > len(m.ctrl)*3 {
		m.rehash()
	}
	var s uint32
	if m.free != nilSlot {
		s = m.free
		m.free = m.slab[s].next
	} else {
		s = uint32(len(m.slab))
		m.slab = append(m.slab, entry[V]{})
	}
	m.slab[s] = entry[V]{hash: h, val: v}
	m.put(h, s)
	m.n++
	m.linkNewest(s)
	return s
}

func (m *Map[V]) put(h uint64, s uint32) {
	mask := len(m.ctrl) - 1
	i := m.home(h)
	for m.ctrl[i] >= 0x80 {
		i = (i + 1) & mask
	}
	if m.ctrl[i] == ctrlDeleted {
		m.dead--
	}
	m.ctrl[i], m.idx[i] = tag(h), s
}

// rehash rebuilds the index without tombstones, twice as large when it is
// more than half full of entries.
func (m *Map[V]) rehash() {
	if m.slab == nil {
		m.free, m.head, m.tail = nilSlot, nilSlot, nilSlot
	}
	size := max(minTable, len(m.ctrl))
	if (m.n+1)*2 > size {
		size *= 2
	}
	m.ctrl, m.idx = make([]uint8, size), make([]uint32, size)
	m.shift = uint(64 - bits.TrailingZeros(uint(size)))
	m.dead = 0
	for s := m.head; s != nilSlot; s = m.slab[s].next {
		m.put(m.slab[s].hash, s)
	}
}

// Delete removes the entry in slot i. Other slots stay valid.
func (m *Map[V]) Delete(i uint32) {
	h := m.slab[i].hash
	mask := len(m.ctrl) - 1
	p := m.home(h)
	for m.ctrl[p] == ctrlEmpty || m.idx[p] != i || m.ctrl[p] == ctrlDeleted {
		p = (p + 1) & mask
	}
	m.unlink(i)
	var zero V
	m.slab[i].val = zero
	m.slab[i].next = m.free
	m.free = i
	m.n--
	// A position followed by an empty one ends every probe sequence
	// through it, so it (and the tombstones before it) can be empty again.
	if m.ctrl[(p+1)&mask] != ctrlEmpty {
		m.ctrl[p] = ctrlDeleted
		m.dead++
		return
	}
	m.ctrl[p] = ctrlEmpty
	for j := (p - 1) & mask; m.ctrl[j] == ctrlDeleted; j = (j - 1) & mask {
		m.ctrl[j] = ctrlEmpty
		m.dead--
	}
}

// Touch makes the entry in slot i the most recently touched. Cost: O(1).
func (m *Map[V]) Touch(i uint32) {
	if m.tail == i {
		return
	}
	m.unlink(i)
	m.linkNewest(i)
}

// Oldest returns the slot of the least recently touched entry.
func (m *Map[V]) Oldest() (uint32, bool) {
	if m.n == 0 {
		return 0, false
	}
	return m.head, true
}

// Next returns the slot touched after slot i, for iterating from Oldest;
// ok is false after the newest.
func (m *Map[V]) Next(i uint32) (uint32, bool) {
	n := m.slab[i].next
	return n, n != nilSlot
}

// Reset removes every entry and releases the memory.
func (m *Map[V]) Reset() { *m = Map[V]{} }

func (m *Map[V]) unlink(i uint32) {
	e := &m.slab[i]
	if e.prev == nilSlot {
		m.head = e.next
	} else {
		m.slab[e.prev].next = e.next
	}
	if e.next == nilSlot {
		m.tail = e.prev
	} else {
		m.slab[e.next].prev = e.prev
	}
}

func (m *Map[V]) linkNewest(i uint32) {
	e := &m.slab[i]
	e.prev, e.next = m.tail, nilSlot
	if m.tail == nilSlot {
		m.head = i
	} else {
		m.slab[m.tail].next = i
	}
	m.tail = i
}
