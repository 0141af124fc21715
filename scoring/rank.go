package scoring

import (
	"cmp"
	"slices"
	"strings"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

// Ranker orders matches by the longest-prefix policy; Names resolves a
// worker id for the final tie-break. Bind Compare once and reuse it so
// that sorting allocates nothing.
type Ranker struct {
	Names []events.WorkerRef // maps a WorkerID to its (pod, rank); ids past its end sort last.
}

// Compare orders a before b when a should take the request: more matched
// blocks, then more GPU blocks, then the smaller (pod, rank).
func (r *Ranker) Compare(a, b indexer.Match) int {
	if c := cmp.Compare(b.Blocks, a.Blocks); c != 0 {
		return c
	}
	if c := cmp.Compare(b.ByMedium[events.MediumGPU], a.ByMedium[events.MediumGPU]); c != 0 {
		return c
	}
	na, oka := r.name(a.Worker)
	nb, okb := r.name(b.Worker)
	if oka != okb {
		if oka {
			return -1
		}
		return 1
	}
	if c := CompareRefs(na, nb); c != 0 {
		return c
	}
	return cmp.Compare(a.Worker, b.Worker)
}

func (r *Ranker) name(id indexer.WorkerID) (events.WorkerRef, bool) {
	if int(id) < len(r.Names) {
		return r.Names[id], true
	}
	return events.WorkerRef{}, false
}

// Rank sorts matches best first. Cost: O(w log w) for w matches, no allocation.
func (r *Ranker) Rank(matches []indexer.Match) {
	slices.SortFunc(matches, r.Compare)
}

// CompareRefs orders workers by pod name, then DP rank.
func CompareRefs(a, b events.WorkerRef) int {
	if c := strings.Compare(a.Pod, b.Pod); c != 0 {
		return c
	}
	return cmp.Compare(a.DPRank, b.DPRank)
}
