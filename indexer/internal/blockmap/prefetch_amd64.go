//go:build amd64 && !purego

package blockmap

// warmBuckets requests the cache lines of buckets p and q (hashes and
// values) with prefetch instructions and returns 0.
//
// Prefetches rather than loads: a load that misses holds up everything
// after it from retiring until its line arrives, so a loop of loads
// stalls once the reorder buffer fills, some dozens of misses in; a
// prefetch retires at once, and the apply after the loop runs while the
// lines arrive: 12% less time per batch in BenchmarkApplyFloor's stream
// (docs/benchmarks.md, "Index rows against their floors").
func warmBuckets(p, q *bucket) uint64 {
	prefetchBuckets(p, q)
	return 0
}

// prefetchBuckets issues PREFETCHT0 for the two cache lines of p and the
// two of q.
//
//go:noescape
func prefetchBuckets(p, q *bucket)
