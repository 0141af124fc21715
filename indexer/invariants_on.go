//go:build invariants || race

package indexer

// invariantsOn compiles in the invariant checks (see Worker.endLocked) with
// the build tag invariants or -race, so that make test's race run has them.
const invariantsOn = true
