package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// subBits sets the histogram's precision: 2^subBits buckets per power of
// two, so a recorded value is known to within 1/2^subBits (0.8%).
const subBits = 7

// numBuckets covers every uint64: values below 2^(subBits+1) exactly, then
// 2^subBits buckets for each further power of two.
const numBuckets = (64 - subBits + 1) << subBits

// Histogram is a log-linear latency histogram in the manner of
// HdrHistogram: fixed memory (58 KB), O(1) Record with no allocation, and
// quantiles within 0.8% of the recorded values. The zero value is empty
// and ready to use. It is not safe for concurrent use.
type Histogram struct {
	counts [numBuckets]uint64
	n      uint64
	max    uint64
}

// bucketOf returns the bucket that holds v (nanoseconds).
func bucketOf(v uint64) int {
	if v < 1<<(subBits+1) {
		return int(v)
	}
	n := bits.Len64(v) // > subBits+1
	shift := n - subBits - 1
	m := v >> shift // in [2^subBits, 2^(subBits+1))
	return (n-subBits)<<subBits + int(m) - 1<<subBits
}

// bucketMax returns the largest value bucket i holds.
func bucketMax(i int) uint64 {
	if i < 1<<(subBits+1) {
		return uint64(i)
	}
	q, r := i>>subBits, uint64(i&(1<<subBits-1))
	shift := q - 1
	m := r + 1<<subBits
	return (m+1)<<shift - 1
}

// Record adds one latency; negative durations count as 0.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[bucketOf(v)]++
	h.n++
	h.max = max(h.max, v)
}

// Merge adds every value recorded in o to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// Count returns the number of recorded values.
func (h *Histogram) Count() uint64 { return h.n }

// Max returns the largest recorded value exactly.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Quantile returns the smallest bucket bound at or below which a fraction q
// (0..1) of the values lie, so it may overstate the true quantile by up to
// 0.8% but never understates it; it never exceeds Max. It returns 0 for an
// empty histogram.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			return time.Duration(min(bucketMax(i), h.max))
		}
	}
	return time.Duration(h.max)
}
