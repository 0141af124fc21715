//go:build !invariants && !race

package indexer

// invariantsOn is false: the invariant checks compile away.
const invariantsOn = false
