package scoring

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/indexer"
)

// MaxSharedDepths is the number of prefix depths at which Route counts
// arrivals (SharedDepth(0) through SharedDepth(MaxSharedDepths-1), the
// last 65,536 blocks).
const MaxSharedDepths = 32

// SharedDepth is the i-th prefix depth, in blocks, at which Route counts
// arrivals: 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and 1.5 times
// them), so that a prompt of n blocks is sampled at about 2 log2(n) depths
// and any prefix length is within a factor 1.5 of a sampled one.
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

// sharedCells is the size of each model's prefix-rate table: 4,096 cells
// of 16 bytes, 64 KiB a model.
const sharedCells = 1 << 12

// rateCell estimates the rate of events it is told of: a moving average
// (weight 1/64) of the gap between them and the time of the last. Its two
// fields are updated without a common lock, so a reader may see one
// event's gap with the previous event's time: an error of one event in
// 64, which the estimates that use it tolerate.
type rateCell struct {
	lastNanos atomic.Int64  // the last event's clock, Unix nanoseconds; 0 before any
	meanGap   atomic.Uint64 // float64 bits, seconds; 0 until two events
}

// note records one event at now.
func (r *rateCell) note(now time.Time) {
	t := now.UnixNano()
	if last := r.lastNanos.Swap(t); last != 0 && t >= last {
		// Simultaneous events (a burst, a coarse clock) count as 1 us
		// apart: a very high rate, not an unknown one.
		ewma(&r.meanGap, max(float64(t-last)/1e9, 1e-6))
	}
}

// rate is events per second at now: one over the mean gap, or over the
// time since the last event when that is longer (events that stopped stop
// counting); 0 before two events.
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
// prefix: a route of a prompt of n blocks is noted, at each sampled depth
// SharedDepth(i) <= n, in the cell of its block key at that depth (content
// keys are chained, so the key at depth d names the whole prefix of d
// blocks). The rate of requests sharing a prompt's first d blocks is then
// one cell's rate.
//
// # Memory
//
// A fixed table of sharedCells cells, allocated with the model's route
// statistics; nothing is added per prefix, so the table never grows and
// never drops a route. Prefixes whose keys fall in one cell add their
// rates: a collision can make a rarely shared prefix look more shared
// (by the rates of the others in its cell, about routes x depths /
// sharedCells per second in all), never less.
//
// # Concurrency
//
// Safe for concurrent use: cells are atomics (see rateCell).
type sharedRates struct {
	cells [sharedCells]rateCell
}

func (s *sharedRates) cell(k indexer.Key) *rateCell {
	// Keys are xxh3 outputs: their low bits are uniform.
	return &s.cells[uint64(k)%sharedCells]
}

// note records a route of keys at now. Cost: one cell update per sampled
// depth, at most MaxSharedDepths; no allocation.
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
// how many it set. Cost: one cell read per sampled depth.
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
