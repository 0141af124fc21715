package events

import (
	"slices"
	"strings"
)

// Tiers is an operator's medium table on top of the built-in one (Medium's
// doc): the class each configured name is held in (overriding the built-in
// class of a name it knows), and the class of names neither table knows. A
// nil *Tiers is the built-in table alone, unknown names in MediumOther.
//
// A transport applies it to each batch before the index sees it
// (Classify), so every medium name of a worker's stores and removals maps
// to the same class.
//
// # Concurrency
//
// Read only once built: safe for concurrent use.
type Tiers struct {
	names   []tierName // sorted by name; compared ignoring case
	unknown Medium
}

type tierName struct {
	name string
	m    Medium
}

// NewTiers returns the table that holds names[n] in its class, and media
// no table knows in unknown. Names are compared ignoring case; of two that
// differ only in case, the one sorting first wins (config rejects them).
func NewTiers(names map[string]Medium, unknown Medium) *Tiers {
	t := &Tiers{unknown: unknown}
	for n, m := range names {
		t.names = append(t.names, tierName{n, m})
	}
	slices.SortFunc(t.names, func(a, b tierName) int { return strings.Compare(a.name, b.name) })
	return t
}

// Unknown returns the class of medium names no table knows.
func (t *Tiers) Unknown() Medium {
	if t == nil {
		return MediumOther
	}
	return t.unknown
}

// Classify sets the Medium of b's stores and removals by the table and
// returns how many named a medium no table knows (held in Unknown) and the
// last such name. A block whose locality is REMOTE stays MediumExternal,
// whatever its name, and is not counted: its class does not depend on it.
//
// Cost: nothing per event for the built-in table alone; with configured
// names, a case-insensitive comparison with each per event.
func (t *Tiers) Classify(b *Batch) (unknown int, name string) {
	for i := range b.Events {
		e := &b.Events[i]
		if e.Kind != KindBlockStored && e.Kind != KindBlockRemoved || e.Locality == LocalityRemote {
			continue
		}
		m, known := e.Medium, e.Medium != MediumOther
		if t != nil {
			for _, n := range t.names {
				if strings.EqualFold(n.name, e.MediumName) {
					m, known = n.m, true
					break
				}
			}
		}
		if !known {
			m = t.Unknown()
			unknown++
			name = e.MediumName
		}
		e.Medium = m
	}
	return unknown, name
}
