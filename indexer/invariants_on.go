//go:build invariants || race

package indexer

// invariantsOn compiles in the invariant checks (build tag invariants, or
// any -race build, so that make test's race run checks them too):
// every batch, Reset, SetCapacity and eviction of a worker ends with
// assertInvariantsLocked.
const invariantsOn = true
