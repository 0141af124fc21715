package scoring

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/indexer"
)

// MaxSharedDepths is the number of prefix depths at which Route counts
// arrivals (up to 65,536 blocks).
const MaxSharedDepths = 32

// SharedDepth is the i-th prefix depth, in blocks, at which Route counts
// arrivals: 1, 2, 3, 4, 6, 8, 12, ... (powers of two and 1.5 times them),
// so a prompt of n blocks is sampled at about 2 log2(n) depths, and any
// prefix length is within a factor 1.5 of a sampled one.
func SharedDepth(i int) int {
	switch {
	case i <= 0:
		return 1
	case i%2 == 1:
		return 1 << ((i + 1) / 2)
	default:
		return 3 << (i/2 - 1)
	}
}

// sharedCells is the size of each model's prefix-rate table (64 KiB).
const sharedCells = 1 << 12

// rateCell estimates the rate of events: a moving average (weight 1/64) of
// the gap between them, and the time of the last. The fields are updated
// without a common lock: a reader may pair one event's gap with the
// previous one's time, an error of one event in 64.
type rateCell struct {
	lastNanos atomic.Int64  // the last event's clock, Unix nanoseconds; 0 before any
	meanGap   atomic.Uint64 // float64 bits, seconds; 0 until two events
}

// note records one event at now.
func (r *rateCell) note(now time.Time) {
	t := now.UnixNano()
	if last := r.lastNanos.Swap(t); last != 0 && t >= last {
		// Simultaneous events count as 1 us apart: a very high rate.
		ewma(&r.meanGap, max(float64(t-last)/1e9, 1e-6))
	}
}

// rate is events per second at now: one over the mean gap, or over the
// time since the last event when longer; 0 before two events.
func (r *rateCell) rate(now time.Time) float64 {
	gap := math.Float64frombits(r.meanGap.Load())
	if gap <= 0 {
		return 0
	}
	if since := float64(now.UnixNano()-r.lastNanos.Load()) / 1e9; since > gap {
		gap = since
	}
	return 1 / gap
}

// sharedRates counts, for one model, the routes whose prompts share a
// prefix: a route is noted at each sampled depth d within its prompt, in
// the cell of its key at d (keys are chained: the key names the whole
// prefix). The rate of requests sharing a prompt's first d blocks is one
// cell's rate. The table is fixed, so it never grows nor drops a route;
// prefixes colliding in a cell add their rates, so a prefix may look more
// shared than it is, never less. Cells are atomics.
type sharedRates struct {
	cells [sharedCells]rateCell
}

func (s *sharedRates) cell(k indexer.Key) *rateCell {
	return &s.cells[uint64(k)%sharedCells]
}

// note records a route of keys at now: a cell update per sampled depth.
func (s *sharedRates) note(keys []indexer.Key, now time.Time) {
	for i := 0; i < MaxSharedDepths; i++ {
		d := SharedDepth(i)
		if d > len(keys) {
			return
		}
		s.cell(keys[d-1]).note(now)
	}
}

// fill sets dst[i] to the rate at now of routes sharing keys' first
// SharedDepth(i) blocks, for every sampled depth within keys, and returns
// how many it set.
func (s *sharedRates) fill(keys []indexer.Key, now time.Time, dst *[MaxSharedDepths]float64) int {
	n := 0
	for ; n < MaxSharedDepths; n++ {
		d := SharedDepth(n)
		if d > len(keys) {
			break
		}
		dst[n] = s.cell(keys[d-1]).rate(now)
	}
	clear(dst[n:])
	return n
}
