package loadgen

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestBucketsCoverValuesWithinPrecision(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	check := func(v uint64) {
		i := bucketOf(v)
		if i < 0 || i >= numBuckets {
			t.Fatalf("bucketOf(%d) = %d, out of [0, %d)", v, i, numBuckets)
		}
		hi := bucketMax(i)
		if hi < v {
			t.Fatalf("bucketMax(bucketOf(%d)) = %d, below the value", v, hi)
		}
		if i > 0 && bucketMax(i-1) >= v {
			t.Fatalf("value %d also fits bucket %d (max %d)", v, i-1, bucketMax(i-1))
		}
		if rel := float64(hi-v) / float64(v+1); rel > 1.0/(1<<subBits) {
			t.Fatalf("bucket of %d ends at %d: %.4f relative error", v, hi, rel)
		}
	}
	for v := uint64(0); v < 5000; v++ {
		check(v)
	}
	for range 100000 {
		check(r.Uint64() >> r.IntN(64))
	}
	check(1<<64 - 1)
	if bucketMax(numBuckets-1) != 1<<64-1 {
		t.Errorf("last bucket ends at %d", bucketMax(numBuckets-1))
	}
}

func TestQuantiles(t *testing.T) {
	var h Histogram
	if h.Quantile(0.99) != 0 || h.Count() != 0 {
		t.Fatal("empty histogram: want zeros")
	}
	// 1..10000 µs, shuffled.
	r := rand.New(rand.NewPCG(3, 4))
	for _, i := range r.Perm(10000) {
		h.Record(time.Duration(i+1) * time.Microsecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5000 * time.Microsecond}, {0.9, 9000 * time.Microsecond}, {0.99, 9900 * time.Microsecond},
		{0.999, 9990 * time.Microsecond}, {1, 10000 * time.Microsecond}, {0, time.Microsecond}} {
		got := h.Quantile(tc.q)
		if got < tc.want || float64(got-tc.want) > float64(tc.want)/(1<<subBits) {
			t.Errorf("Quantile(%v) = %v, want %v (+0.8%%)", tc.q, got, tc.want)
		}
	}
	if h.Max() != 10*time.Millisecond || h.Count() != 10000 {
		t.Errorf("Max %v Count %d", h.Max(), h.Count())
	}
	h.Record(-time.Second) // clock oddities count as 0
	if h.Quantile(0) != 0 {
		t.Errorf("negative duration not recorded as 0")
	}
}

func TestMerge(t *testing.T) {
	var a, b Histogram
	for i := range 100 {
		a.Record(time.Duration(i) * time.Millisecond)
		b.Record(time.Duration(100+i) * time.Millisecond)
	}
	a.Merge(&b)
	if a.Count() != 200 || a.Max() != 199*time.Millisecond {
		t.Fatalf("merged: count %d max %v", a.Count(), a.Max())
	}
	if p := a.Quantile(0.5); p < 99*time.Millisecond || p > 100*time.Millisecond {
		t.Errorf("merged p50 = %v, want ~99ms", p)
	}
}

func BenchmarkRecord(b *testing.B) {
	var h Histogram
	d := 123456 * time.Nanosecond
	for b.Loop() {
		h.Record(d)
		d += 7
	}
}
