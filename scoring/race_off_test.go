//go:build !race

package scoring

// raceEnabled: the race detector makes sync.Pool drop items at random (the
// index pools its match scratch), so allocation counts are meaningless
// under it.
const raceEnabled = false
