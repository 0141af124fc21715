package indexer

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// Inspection: what an operator asks of the index beyond Match. None of it
// is on a router's path.

// Holder is one worker holding a run of a prompt's blocks.
type Holder struct {
	Worker WorkerID
	Media  uint8 // the bitmask of the media it holds the blocks in.
}

// Lookup walks a prompt's keys through the tree and calls visit for each
// run of blocks [from, to) that share one holder set, in order, holders
// sorted by worker (held is reused; it is empty where keys are kept only as
// parents). It stops at the first key the tree lacks or when visit returns
// false, and returns the number of leading keys the tree has. It takes only
// Match's locks, none during visit, and allocates once.
func (ix *Index) Lookup(keys []Key, visit func(from, to int, held []Holder) bool) int {
	var buf []Holder
	_, n := ix.match(keys, nil, nil, func(from, to int, set *holders.Set) bool {
		buf = buf[:0]
		if set != nil {
			for _, e := range set.Entries() {
				buf = append(buf, Holder{Worker: WorkerID(e.Worker()), Media: e.Media()})
			}
		}
		return visit(from, to, buf)
	})
	return n
}

// ResidentKey is one content key a worker holds and its media (the union
// over its blocks at the key).
type ResidentKey struct {
	Key   Key
	Media uint8
}

// Resident returns up to limit of the worker's resident keys greater than
// after (all when !hasAfter), in key order, with the number of distinct
// keys and its Digest, taken in one pass under the worker's mutex so that
// they describe one state. Cost: O(blocks) under the mutex, then a sort of
// the page's candidates; 16 bytes a resident key.
func (w *Worker) Resident(after Key, hasAfter bool, limit int) (page []ResidentKey, total int, digest uint64) {
	w.mu.Lock()
	all := make([]ResidentKey, 0, w.engine.Len())
	var d uint64
	w.eachResidentLocked(func(k Key, media uint8) {
		d += digestTerm(k, media)
		all = append(all, ResidentKey{Key: k, Media: media})
	})
	w.mu.Unlock()
	total = len(all)
	if hasAfter {
		all = slices.DeleteFunc(all, func(r ResidentKey) bool { return r.Key <= after })
	}
	slices.SortFunc(all, func(a, b ResidentKey) int { return cmp.Compare(a.Key, b.Key) })
	if limit >= 0 && len(all) > limit {
		all = all[:limit]
	}
	return all, total, d
}

// EngineBlock is where one of a worker's engine blocks sits in the index.
type EngineBlock struct {
	Hash      uint64
	Found     bool // true when the worker holds a block with that hash; the fields below are set only then.
	Key       Key  // the content key the index computed for the block.
	Parent    Key  // the key Key attaches under, when HasParent.
	HasParent bool
	Media     uint8 // the media the block is stored in.
}

// EngineBlocks appends where each engine block hash sits in the worker. A
// keyed worker knows no engine hashes and refuses (ErrWorkerKind).
func (w *Worker) EngineBlocks(hashes []uint64, dst []EngineBlock) ([]EngineBlock, error) {
	if w.info.Keyed {
		return dst, fmt.Errorf("%w: worker %s is keyed and knows no engine block hashes", ErrWorkerKind, w.info.Ref)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, h := range hashes {
		eb := EngineBlock{Hash: h}
		if slot, ok := w.engine.Get(h); ok {
			e := w.entry(slot)
			l := w.locOf(e)
			eb.Found = true
			eb.Key = w.cur.keyAt(l)
			eb.Parent, eb.HasParent = w.parentOfLocked(l)
			eb.Media = e.media()
		}
		dst = append(dst, eb)
	}
	w.cur.finish()
	return dst, nil
}

// slotKeyLocked returns the content key of the engine-map slot.
func (w *Worker) slotKeyLocked(slot int) Key {
	if w.info.Keyed {
		return Key(w.engine.Hash(slot))
	}
	return w.cur.keyAt(w.locOf(w.entry(slot)))
}

// RemovalCause says why a key left a worker.
type RemovalCause uint8

// Causes of a removal.
const (
	CauseRemoved RemovalCause = iota + 1 // the engine (or a keyed worker's source) removed it.
	// CauseCapacity: evicted beyond the worker's capacity (or dropped by
	// a keyed worker's source).
	CauseCapacity
	CauseBudget // the index evicted it for its memory budget.
)

var causeNames = [...]string{"unknown", "removed", "evicted for capacity", "evicted for the memory budget"}

// String names the cause.
func (c RemovalCause) String() string {
	if int(c) < len(causeNames) {
		return causeNames[c]
	}
	return "unknown"
}

// Removal is one entry of a worker's bounded removal record (the last
// Config.RemovalHistory removals; clears and resets are in Stats), so that
// Diagnose can tell a block removed lately from one never stored.
type Removal struct {
	Key   Key
	Cause RemovalCause
	At    time.Time
}

// DefaultRemovalHistory is the default Config.RemovalHistory (16 bytes a
// removal).
const DefaultRemovalHistory = 256

// maxLoRAs bounds the adapters a worker's record keeps.
const maxLoRAs = 16

// history is a worker's removal record and the LoRA adapters it stored
// under. Guarded by Worker.mu.
type history struct {
	ring      []removal // nil when off; allocated on the first removal
	size      int
	next      int // ring[next] is the oldest once full
	full      bool
	now       int64 // the current batch's time, 0 until the first removal of it
	loras     []string
	lorasOver int // counts adapters seen past maxLoRAs.
}

type removal struct {
	key   Key
	at    int64 // unix nanoseconds
	cause RemovalCause
}

func (h *history) on() bool { return h.size > 0 }

// add records a removal; the clock is read once per batch.
func (h *history) add(k Key, c RemovalCause) {
	if h.ring == nil {
		h.ring = make([]removal, h.size)
	}
	if h.now == 0 {
		h.now = time.Now().UnixNano()
	}
	h.ring[h.next] = removal{key: k, at: h.now, cause: c}
	h.next++
	if h.next == len(h.ring) {
		h.next, h.full = 0, true
	}
}

func (h *history) len() int {
	if h.full {
		return len(h.ring)
	}
	return h.next
}

// noteLoRA records an adapter the worker stored blocks under.
func (h *history) noteLoRA(name string) {
	for _, l := range h.loras {
		if l == name {
			return
		}
	}
	if len(h.loras) >= maxLoRAs {
		h.lorasOver++
		return
	}
	h.loras = append(h.loras, strings.Clone(name))
}

// FindRemoval returns the most recent record of k leaving the worker, and
// the number of removals the record holds.
func (w *Worker) FindRemoval(k Key) (Removal, int, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := &w.hist
	n := h.len()
	for i := 1; i <= n; i++ {
		r := h.ring[(h.next-i+len(h.ring))%len(h.ring)]
		if r.key == k {
			return Removal{Key: k, Cause: r.cause, At: time.Unix(0, r.at)}, n, true
		}
	}
	return Removal{}, n, false
}

// LoRAs returns the adapters the worker stored blocks under (at most
// maxLoRAs, first seen first), and whether more were seen.
func (w *Worker) LoRAs() ([]string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.hist.loras), w.hist.lorasOver > 0
}

// Applied is what an observer is told after a worker applied something:
// exactly one field is set; Batch and Delta are valid only during the call.
type Applied struct {
	Batch   *events.Batch // the engine batch applied.
	Reset   string        // the reason of a reset.
	Delta   *Delta        // the delta a keyed worker applied.
	Restore *Restored     // set when the worker was rebuilt from a snapshot or a checkpoint.
}

// Restored describes a restore an observer is told of.
type Restored struct {
	From   string // "snapshot" or "checkpoint".
	Blocks int64  // the worker's resident blocks after it.
}

// restoredLocked is what unlockThen does after a restore from from.
func (w *Worker) restoredLocked(from string) after {
	return after{apply: true, what: Applied{Restore: &Restored{From: from, Blocks: w.res}}}
}

// Observer is told of every batch, reset, delta and restore a worker
// applies, on the applying goroutine with no index lock held. It must not
// block or retain its arguments.
type Observer func(w *Worker, a *Applied)

type observer struct{ fn Observer }

// AddObserver adds fn to the index's observers and returns the function
// that removes it. Cost without observers: one atomic load per batch.
func (ix *Index) AddObserver(fn Observer) (remove func()) {
	o := &observer{fn: fn}
	ix.observerMu.Lock()
	var next []*observer
	if cur := ix.observers.Load(); cur != nil {
		next = slices.Clone(*cur)
	}
	next = append(next, o)
	ix.observers.Store(&next)
	ix.observerMu.Unlock()
	return func() {
		ix.observerMu.Lock()
		defer ix.observerMu.Unlock()
		cur := ix.observers.Load()
		if cur == nil {
			return
		}
		rest := slices.DeleteFunc(slices.Clone(*cur), func(x *observer) bool { return x == o })
		if len(rest) == 0 {
			ix.observers.Store(nil)
			return
		}
		ix.observers.Store(&rest)
	}
}

// NumObservers returns the number of observers added and not removed.
func (ix *Index) NumObservers() int {
	if cur := ix.observers.Load(); cur != nil {
		return len(*cur)
	}
	return 0
}
