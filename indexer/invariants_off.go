//go:build !invariants && !race

package indexer

// invariantsOn is false without the build tag invariants and without
// -race: the invariant checks compile away.
const invariantsOn = false
