// Package holders implements the holder sets of kvindex's residency index:
// which workers hold a run of blocks, and in which media.
//
// A Set is immutable, so readers use one without a lock while writers
// publish new ones, and one Set is shared by every block of a run. The
// empty set is the nil *Set. A Set of n workers costs 4n bytes plus a
// 32-byte header; callers intern one-worker sets.
package holders

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// MaxWorker is the largest worker id an Entry can carry.
const MaxWorker = 1<<24 - 1

// Entry is one worker's residency in a Set: the worker's id in the high 24
// bits and a non-zero media bitmask in the low 8.
type Entry uint32

// MakeEntry packs a worker id (<= MaxWorker) and a media mask.
func MakeEntry(w uint32, media uint8) Entry { return Entry(w<<8 | uint32(media)) }

// Worker returns the entry's worker id.
func (e Entry) Worker() uint32 { return uint32(e >> 8) }

// Media returns the entry's media mask.
func (e Entry) Media() uint8 { return uint8(e) }

// Set is an immutable set of entries, sorted by worker id, at most one per
// worker, none with an empty media mask. The nil *Set is the empty set.
type Set struct {
	hash uint64 // of ents, to reject unequal sets of equal size in O(1)
	ents []Entry
}

// New returns the set of ents (copied), which must be sorted by worker,
// one per worker, with non-zero media. New(nil) returns nil.
func New(ents []Entry) *Set {
	if len(ents) == 0 {
		return nil
	}
	s := &Set{ents: slices.Clone(ents)}
	s.hash = hashEntries(s.ents)
	return s
}

func hashEntries(ents []Entry) uint64 {
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ents))), len(ents)*4)
	return xxh3.Hash(b)
}

// Len returns the number of workers in s.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.ents)
}

// Entries returns s's entries, sorted by worker, not to be modified.
func (s *Set) Entries() []Entry {
	if s == nil {
		return nil
	}
	return s.ents
}

// Media returns worker w's media mask in s, 0 if s does not hold w.
func (s *Set) Media(w uint32) uint8 {
	if s == nil {
		return 0
	}
	if i, ok := s.search(w); ok {
		return s.ents[i].Media()
	}
	return 0
}

func (s *Set) search(w uint32) (int, bool) {
	lo, hi := 0, len(s.ents)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.ents[m].Worker() < w {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(s.ents) && s.ents[lo].Worker() == w
}

// Broken describes the first way in which s is not a valid Set, or
// returns "" when it is; for invariant checks.
func (s *Set) Broken() string {
	if s == nil {
		return ""
	}
	if len(s.ents) == 0 {
		return "empty non-nil set"
	}
	for i, e := range s.ents {
		if e.Media() == 0 {
			return fmt.Sprintf("entry %d (worker %d) has no medium", i, e.Worker())
		}
		if i > 0 && s.ents[i-1].Worker() >= e.Worker() {
			return fmt.Sprintf("entries %d and %d (workers %d, %d) out of order", i-1, i, s.ents[i-1].Worker(), e.Worker())
		}
	}
	if h := hashEntries(s.ents); h != s.hash {
		return fmt.Sprintf("hash %#x, entries hash to %#x", s.hash, h)
	}
	return ""
}

// Equal reports whether a and b hold the same entries: O(1) unless they
// are distinct pointers of equal size and hash.
func Equal(a, b *Set) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil || a.hash != b.hash || len(a.ents) != len(b.ents) {
		return false
	}
	return slices.Equal(a.ents, b.ents)
}

// Op changes one worker's media in a set: its mask becomes
// mask &^ Clear | Set, and a worker whose mask becomes 0 leaves the set.
type Op struct {
	Worker     uint32
	Set, Clear uint8
}

// Singletons returns the interned one-worker set of (w, media).
type Singletons func(w uint32, media uint8) *Set

// Apply returns s changed by op: s itself when op changes nothing, nil
// when empty, single's interned set for one worker, else a new Set.
func (op Op) Apply(s *Set, single Singletons) *Set {
	if s == nil {
		if op.Set == 0 {
			return nil
		}
		return single(op.Worker, op.Set)
	}
	i, found := s.search(op.Worker)
	var old uint8
	if found {
		old = s.ents[i].Media()
	}
	m := old&^op.Clear | op.Set
	if m == old {
		return s
	}
	n := len(s.ents)
	switch {
	case m == 0 && n == 1:
		return nil
	case m == 0 && n == 2:
		e := s.ents[1-i]
		return single(e.Worker(), e.Media())
	case m != 0 && n == 1 && found:
		return single(op.Worker, m)
	}
	var ents []Entry
	switch {
	case m == 0:
		ents = make([]Entry, 0, n-1)
		ents = append(append(ents, s.ents[:i]...), s.ents[i+1:]...)
	case found:
		ents = slices.Clone(s.ents)
		ents[i] = MakeEntry(op.Worker, m)
	default:
		ents = make([]Entry, 0, n+1)
		ents = append(ents, s.ents[:i]...)
		ents = append(ents, MakeEntry(op.Worker, m))
		ents = append(ents, s.ents[i:]...)
	}
	ns := &Set{ents: ents}
	ns.hash = hashEntries(ents)
	return ns
}
