// Package blockmap is a worker's engine-block map: engine block hash to a
// 56-bit value, with the entries' store recency kept well enough to evict
// the least recently stored ones first.
//
// # Layout
//
// Entries live inline in a bucketized cuckoo hash table. A bucket is 8
// entries in two cache lines, the 8 hashes in one and the 8 values (each
// with its recency epoch in the top 8 bits) in the next, and every hash
// has two candidate buckets: a lookup of an absent hash, which every stored
// block makes, reads two lines of hashes. An insert that finds both buckets
// full moves an entry of one to its other bucket (trying the 16 in turn,
// then a cuckoo walk). Deletion clears the slot: no tombstones. The number
// of buckets is any integer (buckets are picked by multiplying, not
// masking), so the table grows by an eighth at a time at 15/16 full, and
// is 83-94% full: 17 to 19 bytes per entry, none of them a pointer, so the
// garbage collector does not scan it. The layouts measured against it (an
// LRU list, a slab with links) are in docs/benchmarks.md.
//
// # Recency
//
// Instead of a list in touch order (8 bytes of links per entry), every
// Insert and Touch stamps the entry with the current epoch, and the epoch
// advances every max(1, Len/64) stamps, so resident entries span some 64
// epochs. Oldest returns entries of the oldest epoch first, in table order
// within an epoch: the order of stamps to within 1/64 of the entries, and
// exact under 64 entries, found by a scan that resumes where the last one
// stopped (about 64 slots per entry returned). Epochs are 8 bits, a ring of
// 255 and one for the ancient: when the epoch about to be reused still has
// entries, a scan makes every entry of the older half of the ring ancient,
// older than all others, in no order among themselves; so a scan runs at
// most once per 127 advances. Age and InsertAged save and restore recency.
//
// A Map is not safe for concurrent use; the indexer guards each worker's
// with the worker's mutex.
package blockmap

import (
	"iter"
	"math/bits"
)

// ValueBits is the width of a value; values must be non-zero (an empty
// slot is a zero value).
const ValueBits = 56

const (
	ways       = 8 // slots per bucket: a cache line of hashes, one of values
	waysLog    = 3
	valueMask  = 1<<ValueBits - 1
	epochs     = 1 << (64 - ValueBits)
	epochShift = ValueBits
	ring       = epochs - 1 // epochs the ring cycles through
	ancient    = ring       // the epoch of entries not stamped for ring/2 epochs or more
	epochsSpan = 64         // resident entries span about this many epochs
	minBuckets = 1
	maxKicks   = 256 // cuckoo walk steps before the table grows
	loadNum    = 15  // the table grows when more than loadNum/loadDen
	loadDen    = 16  // of its slots are full
	growNum    = 9   // and then to growNum/growDen of its buckets
	growDen    = 8
	noScan     = -1
	noSlot     = -1
	// pageBuckets buckets fill an allocator page (8 KB): larger tables are
	// a whole number of pages.
	pageBuckets = 8192 / (ways * 16)
	mulBucket1  = 0x9e3779b97f4a7c15
	mulBucket2  = 0xc2b2ae3d27d4eb4f
	walkMul     = 6364136223846793005 // a 64-bit LCG for the walk's choices
	walkIncr    = 1442695040888963407
)

// Map maps engine block hashes to values.
type Map struct {
	b  []bucket
	nb uint64 // len(b)
	n  int    // live entries

	// Recency: the current epoch, live entries per epoch, stamps since the
	// epoch last advanced, and where the scan for the oldest entries is.
	epoch   uint8
	count   [epochs]int32
	stamps  int
	scanAt  int
	scanFor int // the epoch the scan looks for, or noScan

	zeros int // entries of hash 0 (whose slots look empty by hash alone)

	walk uint64 // state of the cuckoo walk's random choices
}

// bucket is ways slots: their hashes, and their metas (epoch<<epochShift
// | value; 0 when the slot is empty, whose hash is 0 too). Slot i is
// b[i/ways] at i%ways.
type bucket struct {
	hash [ways]uint64
	meta [ways]uint64
}

// buckets returns hash h's two buckets: a multiply guards against
// sequential hashes, and the bucket is the high word of the product with
// nb (Lemire's range reduction), so nb may be any number.
func (m *Map) buckets(h uint64) (uint64, uint64) {
	x := h ^ h>>31
	b1, _ := bits.Mul64(x*mulBucket1, m.nb)
	b2, _ := bits.Mul64((x^x>>29)*mulBucket2, m.nb)
	return b1, b2
}

// find returns the position of h in bucket b, or -1, reading the line of
// hashes only unless h is 0 (the hash of empty slots too).
func (b *bucket) find(h uint64) int {
	for i := range b.hash {
		if b.hash[i] == h && (h != 0 || b.meta[i] != 0) {
			return i
		}
	}
	return -1
}

// free returns a free position of bucket b, or -1, reading the line of
// hashes only unless the table holds an entry of hash 0.
func (b *bucket) free(zero bool) int {
	for i := range b.hash {
		if b.hash[i] == 0 && (!zero || b.meta[i] == 0) {
			return i
		}
	}
	return -1
}

// used returns the number of full slots of b by its hashes (a tie-break
// only: an entry of hash 0 counts as free).
func (b *bucket) used() int {
	n := 0
	for _, h := range b.hash {
		if h != 0 {
			n++
		}
	}
	return n
}

// Len returns the number of entries.
func (m *Map) Len() int { return m.n }

// Get returns the slot of hash h. Cost: two cache lines of hashes at most
// (loaded in parallel) and the entry's line of values; no allocation.
func (m *Map) Get(h uint64) (int, bool) {
	if m.n == 0 {
		return noSlot, false
	}
	b1, b2 := m.buckets(h)
	if i := m.b[b1].find(h); i >= 0 {
		return int(b1)*ways + i, true
	}
	if i := m.b[b2].find(h); i >= 0 {
		return int(b2)*ways + i, true
	}
	return noSlot, false
}

// Warm starts loading the four cache lines that a lookup and an insert of
// h touch, changing nothing, and returns a value for the caller to keep so
// that the loads are not elided. The loads are independent, so a loop of
// Warms keeps many misses in flight where a loop of Gets waits for them one
// after another; on amd64 they are prefetches, which retire at once, so the
// work after the loop overlaps them too.
func (m *Map) Warm(h uint64) uint64 {
	if m.nb == 0 {
		return 0
	}
	b1, b2 := m.buckets(h)
	return warmBuckets(&m.b[b1], &m.b[b2])
}

// Val returns the value in slot i.
func (m *Map) Val(i int) uint64 { return m.b[i/ways].meta[i%ways] & valueMask }

// SetVal replaces the value in slot i with v (non-zero, ValueBits wide),
// keeping its recency.
func (m *Map) SetVal(i int, v uint64) {
	p := &m.b[i/ways].meta[i%ways]
	*p = *p&^valueMask | v
}

// Hash returns the hash of the entry in slot i.
func (m *Map) Hash(i int) uint64 { return m.b[i/ways].hash[i%ways] }

// Insert adds hash h, which must be absent, with value v (non-zero,
// ValueBits wide) as the most recently stored entry, and returns its
// slot. Other entries may move: a slot stays valid until the next Insert
// or Reset. Cost: the two buckets of h, for a fifth of inserts or fewer one
// or two more; no allocation but the table's growth.
func (m *Map) Insert(h, v uint64) int {
	i := m.insert(h, v, m.epoch)
	m.stamped()
	return i
}

// Ancient is the Age of an entry older than every other (not stamped for
// ring/2 epochs or more), in no order among its like.
const Ancient = ancient

// Age returns the recency of the entry in slot i: how many times the epoch
// advanced since it was last stamped, from 0 up to 254, or Ancient.
func (m *Map) Age(i int) uint8 {
	e := uint8(m.b[i/ways].meta[i%ways] >> epochShift)
	if e == ancient {
		return Ancient
	}
	return uint8(m.age(e))
}

// InsertAged is Insert with the entry stamped age advances ago, for a
// restore that reproduces a saved map's recency (in order of epochs). It
// does not count as a stamp.
func (m *Map) InsertAged(h, v uint64, age uint8) int {
	e := uint8(ancient)
	if age < ancient {
		e = uint8((int(m.epoch) - int(age) + ring) % ring)
	}
	return m.insert(h, v, e)
}

// insert adds hash h, which must be absent, with value v stamped epoch e,
// and returns its slot.
func (m *Map) insert(h, v uint64, e uint8) int {
	if v == 0 || v > valueMask {
		panic("blockmap: value out of range")
	}
	if (m.n+1)*loadDen > len(m.b)*ways*loadNum {
		m.grow(entry{})
	}
	i, left := m.place(entry{h, uint64(e)<<epochShift | v})
	if left.meta != 0 {
		m.grow(left)
	}
	if i == noSlot {
		i, _ = m.Get(h)
	}
	m.n++
	if h == 0 {
		m.zeros++
	}
	m.count[e]++
	return i
}

// entry is a slot's contents, on its way into the table.
type entry struct{ hash, meta uint64 }

// place puts e into one of its buckets, moving other entries to their
// other bucket if both are full, and returns its slot. When that fails
// (rarely) it returns the entry left without a slot, e or one it
// displaced, for the caller to grow the table with.
func (m *Map) place(e entry) (int, entry) {
	b1, b2 := m.buckets(e.hash)
	p, q := &m.b[b1], &m.b[b2]
	// The emptier bucket: balanced buckets leave fewer inserts with both
	// full.
	z := m.zeros > 0 || e.hash == 0
	f1, f2 := p.free(z), q.free(z)
	switch {
	case f1 >= 0 && f2 < 0:
		p.hash[f1], p.meta[f1] = e.hash, e.meta
		return int(b1)*ways + f1, entry{}
	case f1 >= 0 && p.used() <= q.used():
		p.hash[f1], p.meta[f1] = e.hash, e.meta
		return int(b1)*ways + f1, entry{}
	case f2 >= 0:
		q.hash[f2], q.meta[f2] = e.hash, e.meta
		return int(b2)*ways + f2, entry{}
	}
	// Both full: move one of their entries to its other bucket, trying
	// them in turn.
	for k := range 2 * ways {
		b, d := b1, p
		if k >= ways {
			b, d = b2, q
		}
		j := k % ways
		c1, c2 := m.buckets(d.hash[j])
		a := c1
		if c1 == b {
			a = c2
		}
		o := &m.b[a]
		if f := o.free(z); f >= 0 {
			o.hash[f], o.meta[f] = d.hash[j], d.meta[j]
			d.hash[j], d.meta[j] = e.hash, e.meta
			return int(b)*ways + j, entry{}
		}
	}
	// A cuckoo walk: displace a random entry, and carry it on.
	b := b1
	for range maxKicks {
		m.walk = m.walk*walkMul + walkIncr
		j := int(m.walk >> (64 - waysLog))
		d := &m.b[b]
		e, d.hash[j], d.meta[j] = entry{d.hash[j], d.meta[j]}, e.hash, e.meta
		c1, c2 := m.buckets(e.hash)
		if c1 == b {
			b = c2
		} else {
			b = c1
		}
		if f := m.b[b].free(z); f >= 0 {
			m.b[b].hash[f], m.b[b].meta[f] = e.hash, e.meta
			return noSlot, entry{} // the caller finds its entry again
		}
	}
	return noSlot, e
}

// grow rebuilds the table with growNum/growDen as many buckets.
func (m *Map) grow(extra entry) { m.rebuild(m.nb*growNum/growDen+1, extra) }

// rebuild rebuilds the table with nb buckets or more (more each time
// placing the entries fails), with every entry and extra (unless zero).
func (m *Map) rebuild(nb uint64, extra entry) {
	old := m.b
	for {
		nb = max(minBuckets, nb)
		if nb > 4*pageBuckets {
			nb = (nb + pageBuckets - 1) / pageBuckets * pageBuckets
		}
		m.b, m.nb = make([]bucket, nb), nb
		ok := true
		if extra.meta != 0 {
			_, left := m.place(extra)
			ok = left.meta == 0
		}
		for i := 0; ok && i < len(old)*ways; i++ {
			if o := &old[i/ways]; o.meta[i%ways] != 0 {
				_, left := m.place(entry{o.hash[i%ways], o.meta[i%ways]})
				ok = left.meta == 0
			}
		}
		if ok {
			break
		}
		nb = nb*growNum/growDen + 1
	}
	m.scanFor = noScan
}

// Reserve makes room for n entries in all, saving a caller that knows how
// many it is about to insert (a restore) the growth by an eighth at a
// time. Cost: one rebuild when the table is smaller.
func (m *Map) Reserve(n int) {
	nb := uint64((n*loadDen + ways*loadNum - 1) / (ways * loadNum))
	if nb > m.nb {
		m.rebuild(nb, entry{})
	}
}

// ReserveGrown makes room for n entries as a table that has just grown to
// hold them (83% full, not the 94% that triggers a growth): a table churned
// at a steady size near 94% moves entries out of cache far more often (a
// restored replica worker applies 15-20% more blocks a CPU-second so).
func (m *Map) ReserveGrown(n int) { m.Reserve(n * growNum / growDen) }

// Delete removes the entry in slot i. Other slots stay valid.
func (m *Map) Delete(i int) {
	b := &m.b[i/ways]
	m.count[b.meta[i%ways]>>epochShift]--
	if b.hash[i%ways] == 0 {
		m.zeros--
	}
	b.hash[i%ways], b.meta[i%ways] = 0, 0
	m.n--
}

// Touch makes the entry in slot i the most recently stored. Cost: O(1).
func (m *Map) Touch(i int) {
	p := &m.b[i/ways].meta[i%ways]
	if e := uint8(*p >> epochShift); e != m.epoch {
		m.count[e]--
		m.count[m.epoch]++
		*p = *p&valueMask | uint64(m.epoch)<<epochShift
	}
	m.stamped()
}

// stamped counts a stamp, and advances the epoch every max(1,
// Len/epochsSpan) of them.
func (m *Map) stamped() {
	if m.stamps++; m.stamps < max(1, m.n/epochsSpan) {
		return
	}
	m.stamps = 0
	next := m.epoch + 1
	if next == ancient {
		next = 0
	}
	if m.count[next] > 0 {
		// next still has entries, stamped ring epochs ago: make the older
		// half of the ring ancient, so the next ring/2 advances need no scan.
		for i := range m.b {
			for j, meta := range m.b[i].meta {
				if e := uint8(meta >> epochShift); meta != 0 && e != ancient && m.age(e) >= ring/2 {
					m.count[e]--
					m.count[ancient]++
					m.b[i].meta[j] = meta&valueMask | ancient<<epochShift
				}
			}
		}
		if m.scanFor != noScan && m.scanFor != ancient && m.age(uint8(m.scanFor)) >= ring/2 {
			m.scanFor = noScan
		}
	}
	m.epoch = next
}

// age returns how many advances ago epoch e was current.
func (m *Map) age(e uint8) int { return (int(m.epoch) - int(e) + ring) % ring }

// Oldest appends to dst up to n slots of the least recently stored
// entries, oldest epoch first. The slots stay valid until the next Insert;
// the caller must Delete each before calling Oldest again. Cost: a scan
// resumed where the previous one stopped, of about epochsSpan slots per
// entry returned.
func (m *Map) Oldest(n int, dst []int) []int {
	start := len(dst)
	want := min(n, m.n)
	// Entries returned count in their epoch until deleted: taken tracks them.
	var taken [epochs]int32
	slots := len(m.b) * ways
	for len(dst)-start < want {
		e := m.oldestEpoch(&taken)
		if m.scanFor != int(e) {
			// Entries of e before the scan position were returned earlier,
			// unless an insert moved one there: the scan then wraps.
			m.scanFor, m.scanAt = int(e), 0
		}
		from, wrapped := m.scanAt, false
		for len(dst)-start < want && taken[e] < m.count[e] {
			if m.scanAt == slots {
				m.scanAt, wrapped = 0, true
			}
			if wrapped && m.scanAt == from {
				panic("blockmap: epoch counts disagree with the table")
			}
			if meta := m.b[m.scanAt/ways].meta[m.scanAt%ways]; meta != 0 && uint8(meta>>epochShift) == e {
				dst = append(dst, m.scanAt)
				taken[e]++
			}
			m.scanAt++
		}
	}
	return dst
}

// oldestEpoch returns the oldest epoch with entries not yet taken.
func (m *Map) oldestEpoch(taken *[epochs]int32) uint8 {
	if m.count[ancient] > taken[ancient] {
		return ancient
	}
	for a := ring - 1; a >= 0; a-- {
		e := uint8((int(m.epoch) - a + ring) % ring)
		if m.count[e] > taken[e] {
			return e
		}
	}
	panic("blockmap: no entries left to return")
}

// All yields the slot of every entry, in table order.
func (m *Map) All() iter.Seq[int] {
	return func(yield func(int) bool) {
		for i := range m.b {
			for j, meta := range m.b[i].meta {
				if meta != 0 && !yield(i*ways+j) {
					return
				}
			}
		}
	}
}

// Reset removes every entry and releases the memory.
func (m *Map) Reset() { *m = Map{} }
