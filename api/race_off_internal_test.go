//go:build !race

package api

// raceOn: the race detector makes sync.Pool drop items at random, so
// allocation counts are meaningless under it.
const raceOn = false
