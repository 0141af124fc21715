package sim

import (
	"slices"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// Bounds are what a workload allows any router, computed offline from
// the requests that fit an engine:
//
//   - hit rate: each request, in arrival order, hits the longest prefix of
//     its full prompt blocks (at most (tokens-1)/block size) that an
//     earlier request's prompt or output held, as an infinite cache that
//     had run every earlier request would. No router caches more, unless
//     it schedules a request before an earlier arrival sharing its blocks.
//   - TTFT: each request's own prefill after the bound's hit, alone on an
//     idle engine in steps of MaxBatchedTokens; every percentile of a
//     router's TTFT is at least the bound's.
type Bounds struct {
	// Requests counted, their PromptTokens, and the CachedTokens the
	// hit-rate bound finds.
	Requests                   int
	PromptTokens, CachedTokens int64
	// TTFT holds every request's lower bound, sorted; the rest summarise it.
	TTFT                      []time.Duration
	TTFTP50, TTFTP90, TTFTP99 time.Duration
	TTFTMean                  time.Duration
}

// TokenHitRate is the bound's share of prompt tokens cached.
func (b *Bounds) TokenHitRate() float64 {
	if b == nil || b.PromptTokens == 0 {
		return 0
	}
	return float64(b.CachedTokens) / float64(b.PromptTokens)
}

// OfBound is r's cached tokens as a fraction of the bound's (0 when the
// bound caches nothing).
func (b *Bounds) OfBound(r *metrics.Result) float64 {
	if b == nil || b.CachedTokens == 0 {
		return 0
	}
	return float64(r.CachedTokens) / float64(b.CachedTokens)
}

// ComputeBounds computes w's bounds on o's engines. Cost: one pass,
// O(blocks) hashing, and a set of every distinct block prefix (about
// 20 MB for the Mooncake trace at 16-token blocks).
func ComputeBounds(w *workload.Workload, o Options) (*Bounds, error) {
	o, err := o.withDefaults(w.Engines)
	if err != nil {
		return nil, err
	}
	bs := o.Engine.BlockSize
	e, err := engine.New(0, o.Engine)
	if err != nil {
		return nil, err
	}
	tm := o.Engine.Time
	b := &Bounds{}
	seen := make(map[uint64]struct{})
	var content []uint64
	for i := range w.Requests {
		r := &w.Requests[i]
		if !e.Fits(r) {
			continue
		}
		content = r.AppendBlockContent(content[:0], bs, r.OutputSegment(o.Seed))
		limit := (r.PromptLen - 1) / bs
		hit, h, matching := 0, uint64(0x626f756e64), true // "bound"
		for k, c := range content {
			h = workload.Mix64(h ^ c)
			if matching && k < limit {
				if _, ok := seen[h]; ok {
					hit++
				} else {
					matching = false
				}
			}
			seen[h] = struct{}{}
		}
		b.Requests++
		b.PromptTokens += int64(r.PromptLen)
		b.CachedTokens += int64(hit * bs)
		b.TTFT = append(b.TTFT, soloPrefill(tm, hit*bs, r.PromptLen-hit*bs, o.Engine.MaxBatchedTokens))
	}
	slices.Sort(b.TTFT)
	b.TTFTP50, b.TTFTP90, b.TTFTP99, b.TTFTMean = metrics.Summary(b.TTFT)
	return b, nil
}

// soloPrefill is how long an idle engine takes to prefill n tokens (at
// least one) after cached ones, in steps of at most budget tokens.
func soloPrefill(tm engine.TimeModel, cached, n, budget int) time.Duration {
	n = max(n, 1)
	var d time.Duration
	for n > 0 {
		chunk := min(n, budget)
		d += tm.StepTime(chunk, engine.AttentionPairs(chunk, cached), 0, 0)
		cached += chunk
		n -= chunk
	}
	return d
}
