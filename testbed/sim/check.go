package sim

import (
	"fmt"
	"strings"

	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/sim/engine"
)

// indexCheck is the end-of-run check of one router's kvindex against its
// engines, once every batch is applied: what kvindex could not apply
// exactly, by kind, and the KV-cache groups whose resident blocks differ
// from what their engine caches in them. Its total is
// metrics.Result.IndexProblems, its String IndexDetail.
type indexCheck struct {
	n     [numProblems]int64
	first string // the first difference met, "" when none
}

// problem is a kind of disagreement the check counts.
type problem int

const (
	probDecode    problem = iota // payloads kvindex could not decode
	probRefused                  // events refused: token counts, group indices, unknown kinds or media
	probOrphans                  // blocks stored under a parent never announced
	probUnknown                  // removals or offloads of blocks not held (in a worker or a group)
	probBlockSize                // prefix-group stores of a block size other than the model's
	probLayout                   // stores refused for describing a group that holds blocks anew
	probDropped                  // blocks refused past a side group's bound or evicted for capacity
	probStream                   // gaps and restarts of an event stream (live)
	probWorkers                  // workers missing, behind their engine's batches, or unequal across replicas (live)
	probGroups                   // KV-cache groups whose resident blocks differ from their engine's cache
	numProblems
)

var problemNames = [numProblems]string{
	"payloads not decoded", "events refused", "orphan blocks", "removals of blocks not held",
	"block-size mismatches", "layout changes refused", "blocks dropped", "gaps or restarts",
	"workers missing or behind", "KV-cache groups unlike their engine's cache",
}

func (c *indexCheck) add(p problem, n int64) { c.n[p] += n }

// note keeps the first difference's description.
func (c *indexCheck) note(format string, args ...any) {
	if c.first == "" {
		c.first = fmt.Sprintf(format, args...)
	}
}

// total is every problem counted (0: kvindex agreed with the engines).
func (c *indexCheck) total() int64 {
	var t int64
	for _, n := range c.n {
		t += n
	}
	return t
}

// String names what was counted, "" when nothing was: "12295 events
// refused; 8 KV-cache groups unlike their engine's cache (first: ...)".
func (c *indexCheck) String() string {
	var parts []string
	for p, n := range c.n {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, problemNames[p]))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	s := strings.Join(parts, "; ")
	if c.first != "" {
		s += " (first: " + c.first + ")"
	}
	return s
}

// addStats counts what a worker's counters say it could not apply.
func (c *indexCheck) addStats(s *indexer.Stats) {
	c.add(probRefused, s.InvalidEvents)
	c.add(probOrphans, s.Orphans)
	c.add(probUnknown, s.UnknownBlocks+s.UnknownGroupBlocks)
	c.add(probBlockSize, s.BlockSizeMismatches)
	c.add(probLayout, s.LayoutChanges)
	c.add(probDropped, s.SideRefused+s.Evictions)
}

// addStatus counts what a worker's status (live mode) says it could not
// apply, its stream's losses included.
func (c *indexCheck) addStatus(ws *kvindexv1.WorkerStatus) {
	c.add(probDecode, int64(ws.GetDecodeErrors()))
	c.add(probRefused, int64(ws.GetInvalidEvents()))
	c.add(probOrphans, int64(ws.GetOrphans()))
	c.add(probUnknown, int64(ws.GetUnknownBlocks()+ws.GetUnknownGroupBlocks()))
	c.add(probBlockSize, int64(ws.GetBlockSizeMismatches()))
	c.add(probLayout, int64(ws.GetLayoutChanges()))
	c.add(probDropped, int64(ws.GetSideRefused()+ws.GetEvictions()+ws.GetBudgetEvictions()))
	c.add(probStream, int64(ws.GetGaps()+ws.GetRestarts()))
}

// compareGroups counts engine i's KV-cache groups whose resident blocks
// in kvindex (held: by group index, false for a group kvindex never
// learned) differ from the distinct blocks the engine caches in them.
func (c *indexCheck) compareGroups(i int, e *engine.Engine, held func(group int) (int64, bool)) {
	for g, grp := range e.Groups() {
		want := int64(e.CachedBlocksIn(g))
		got, _ := held(g)
		if got != want {
			c.add(probGroups, 1)
			c.note("engine %d group %d (%s) caches %d blocks, kvindex holds %d", i, g, grp.Kind, want, got)
		}
	}
}

// workerGroups is held for compareGroups from a worker's groups.
func workerGroups(gs []indexer.Group) func(int) (int64, bool) {
	return func(idx int) (int64, bool) {
		for _, g := range gs {
			if g.Index == idx {
				return g.Blocks, true
			}
		}
		return 0, false
	}
}

// statusGroups is held for compareGroups from a worker's status.
func statusGroups(ws *kvindexv1.WorkerStatus) func(int) (int64, bool) {
	return func(idx int) (int64, bool) {
		for _, g := range ws.GetGroups() {
			if int(g.GetIndex()) == idx {
				return int64(g.GetResidentBlocks()), true
			}
		}
		return 0, false
	}
}
