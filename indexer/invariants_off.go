//go:build !invariants

package indexer

// invariantsOn is false without the build tag invariants: the invariant
// checks compile away.
const invariantsOn = false
