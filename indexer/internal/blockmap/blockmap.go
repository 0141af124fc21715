// Package blockmap is a worker's engine-block map: engine block hash to a
// small value, with the entries linked in the order they were last touched
// so that the least recently touched one can be evicted in O(1).
//
// It is golang-lru's simplelru reduced to what a worker needs and laid out
// for the cache: one open-addressing table whose entries hold the hash,
// the value and the two list links inline, and a separate array of one
// control byte per entry (empty, deleted, or 7 bits of the hash). A probe
// scans the control bytes, which for a 100 k-block worker are 128 KB and
// stay in L2, and touches an entry only on a tag match, so a lookup costs
// one cache miss. Deletion leaves a tombstone, so entries never move and
// the list links (entry indices) stay valid; a rehash, when tombstones and
// entries fill 7/8 of the table, rebuilds the list in order.
//
// Measured with BenchmarkLRU (this package; 80 k entries; per block: a
// lookup of the new hash, its insert, a touch of its parent, and later the
// lookup and removal of the block), on the project's 2-core benchmark
// machine (Xeon, KVM, Go 1.26):
//
//	                                        ns/block  allocs  bytes/entry
//	golang-lru/v2 v2.0.7 simplelru            230       1       132
//	map of hash to slab index + slab list      80       0        65
//	this layout                                56       0     47-82 (*)
//
// (*) by the table's load, 7/16 to 7/8: 82 just after a doubling (1 Mi
// entries), 66 for a 10 k-block worker (BenchmarkMemory10M). golang-lru
// allocates an element per entry (key, value, two links, the list, an
// expiry time) behind a map of pointers; an intrusive list in a slab
// removes the allocation, and putting the entries inline behind control
// bytes removes the second cache miss of every lookup.
//
// A Map is not safe for concurrent use; the indexer guards each worker's
// with the worker's mutex.
package blockmap

import "math/bits"

// Map maps engine block hashes to values of type V in touch order.
type Map[V any] struct {
	ctrl  []uint8
	ents  []entry[V]
	shift uint // 64 - log2(len(ctrl))
	n     int  // live entries
	dead  int  // tombstones
	// head and tail are the least and most recently touched entries, nil
	// when empty.
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
	// live control bytes are 0x80 | 7 bits of the hash.
	nilSlot  = ^uint32(0)
	minTable = 16
)

// tag is hash h's control byte.
func tag(h uint64) uint8 { return 0x80 | uint8(h>>57) }

// home is the slot where hash h's probe sequence starts: Fibonacci hashing
// of h (engine hashes are uniform already; the multiply guards against
// sequential ones).
func (m *Map[V]) home(h uint64) int {
	return int((h ^ h>>31) * 0x9e3779b97f4a7c15 >> m.shift)
}

// Len returns the number of entries.
func (m *Map[V]) Len() int { return m.n }

// Get returns the slot of hash h. Cost: a scan of control bytes and one
// entry per tag match (1 in 128 for another hash): about one cache miss.
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
		case c == t && m.ents[i].hash == h:
			return uint32(i), true
		}
	}
}

// At returns the value in slot i. The pointer is valid until the next
// Insert, which may rehash.
func (m *Map[V]) At(i uint32) *V { return &m.ents[i].val }

// Hash returns the hash of the entry in slot i.
func (m *Map[V]) Hash(i uint32) uint64 { return m.ents[i].hash }

// Insert adds hash h, which must be absent, with value v as the most
// recently touched entry, and returns its slot. Slots returned earlier
// are invalid after an Insert. Cost: one probe; amortised O(1) rehash.
func (m *Map[V]) Insert(h uint64, v V) uint32 {
	if (m.n+m.dead+1)*8 > len(m.ctrl)*7 {
		m.rehash()
	}
	mask := len(m.ctrl) - 1
	i := m.home(h)
	for m.ctrl[i] >= 0x80 {
		i = (i + 1) & mask
	}
	if m.ctrl[i] == ctrlDeleted {
		m.dead--
	}
	m.ctrl[i] = tag(h)
	m.ents[i] = entry[V]{hash: h, val: v}
	m.n++
	m.linkNewest(uint32(i))
	return uint32(i)
}

// rehash rebuilds the table without tombstones, twice as large when it is
// more than half full of entries, keeping the touch order.
func (m *Map[V]) rehash() {
	size := max(minTable, len(m.ctrl))
	if (m.n+1)*2 > size {
		size *= 2
	}
	old, oldCtrl, oldHead := m.ents, m.ctrl, m.head
	*m = Map[V]{
		ctrl:  make([]uint8, size),
		ents:  make([]entry[V], size),
		shift: uint(64 - bits.TrailingZeros(uint(size))),
		head:  nilSlot,
		tail:  nilSlot,
	}
	mask := size - 1
	for i := oldHead; oldCtrl != nil && i != nilSlot; i = old[i].next {
		e := &old[i]
		j := m.home(e.hash)
		for m.ctrl[j] != ctrlEmpty {
			j = (j + 1) & mask
		}
		m.ctrl[j] = tag(e.hash)
		m.ents[j] = entry[V]{hash: e.hash, val: e.val}
		m.n++
		m.linkNewest(uint32(j))
	}
}

// Delete removes the entry in slot i. Other slots stay valid.
func (m *Map[V]) Delete(i uint32) {
	m.unlink(i)
	var zero entry[V]
	m.ents[i] = zero
	m.n--
	// A slot followed by an empty one ends every probe sequence through
	// it, so it (and the tombstones before it) can be empty again.
	mask := len(m.ctrl) - 1
	if m.ctrl[(int(i)+1)&mask] != ctrlEmpty {
		m.ctrl[i] = ctrlDeleted
		m.dead++
		return
	}
	m.ctrl[i] = ctrlEmpty
	for j := (int(i) - 1) & mask; m.ctrl[j] == ctrlDeleted; j = (j - 1) & mask {
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
	n := m.ents[i].next
	return n, n != nilSlot
}

// Reset removes every entry and releases the memory.
func (m *Map[V]) Reset() { *m = Map[V]{} }

func (m *Map[V]) unlink(i uint32) {
	e := &m.ents[i]
	if e.prev == nilSlot {
		m.head = e.next
	} else {
		m.ents[e.prev].next = e.next
	}
	if e.next == nilSlot {
		m.tail = e.prev
	} else {
		m.ents[e.next].prev = e.prev
	}
}

func (m *Map[V]) linkNewest(i uint32) {
	e := &m.ents[i]
	e.prev, e.next = m.tail, nilSlot
	if m.tail == nilSlot {
		m.head = i
	} else {
		m.ents[m.tail].next = i
	}
	m.tail = i
}
