//go:build !amd64 || purego

package blockmap

// warmBuckets loads the cache lines of buckets p and q (hashes and
// values) and returns the sum of what it read, for the caller to keep so
// that the loads are not elided.
func warmBuckets(p, q *bucket) uint64 {
	return p.hash[0] + q.hash[0] + p.meta[0] + q.meta[0]
}
