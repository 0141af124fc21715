//go:build invariants

package indexer

// invariantsOn compiles in the invariant checks (build tag invariants):
// every batch, Reset, SetCapacity and eviction of a worker ends with
// assertInvariantsLocked.
const invariantsOn = true
