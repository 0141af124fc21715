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

// Inspection. What an operator asks of the index beyond Match: who holds
// each block of a prompt (Lookup), what one worker holds (Resident), where
// a worker's engine blocks sit (EngineBlocks), what it removed lately
// (FindRemoval) and what it applies as it happens (AddObserver). None of
// them is on a router's path; each states its cost.

// Holder is one worker holding a run of a prompt's blocks.
type Holder struct {
	// Worker is the worker's id.
	Worker WorkerID
	// Media is the bitmask of the media it holds the blocks in (bit m for
	// events.Medium m).
	Media uint8
}

// Lookup walks keys (a prompt's keys from its first block, as PromptKeys
// computes them) through the tree and calls visit for each run of
// consecutive blocks [from, to) that share one holder set, in order,
// with the holders sorted by worker (held is reused after visit returns;
// a run may have no holders, when its keys are kept only as parents of
// held keys). It stops at the first key the tree does not have, or when
// visit returns false, and returns the number of leading keys the tree
// has.
//
// Lookup takes no lock but Match's (a heads shard's read lock per node
// entered) and calls visit with none held. Cost: O(blocks walked + the
// holders of each run) and one allocation for the holders.
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

// ResidentKey is one content key a worker holds and the media it holds
// it in (the union over its blocks at the key).
type ResidentKey struct {
	Key   Key
	Media uint8
}

// Resident returns up to limit of the worker's resident keys greater than
// after (all keys when !hasAfter), in increasing key order, with the
// number of distinct keys it holds and its Digest, all taken in one pass
// under the worker's mutex, so that the page and the digest describe the
// same state.
//
// Cost: O(blocks) under the mutex (a Digest's pass, each key read from
// the tree), then O(k log k) to sort the k keys after after, outside it;
// it allocates 16 bytes per resident key. It is an operator's call.
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
	// Hash is the engine's block hash.
	Hash uint64
	// Found is true when the worker holds a block with that hash; the
	// fields below are valid only then.
	Found bool
	// Key is the content key the index computed for the block, from its
	// BlockStored event's tokens, parent and extra keys.
	Key Key
	// Parent is the key Key attaches under; HasParent is false at top
	// level (a root's first block, or an orphan).
	Parent    Key
	HasParent bool
	// Media are the media the block is stored in.
	Media uint8
}

// EngineBlocks looks up each engine block hash in the worker's engine map
// and appends where each sits. A keyed worker (a fleet replica) knows no
// engine hashes and refuses with ErrWorkerKind. Cost: one engine-map probe
// and a tree read per hash, under the worker's mutex.
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

// slotKeyLocked returns the content key of the engine-map slot. Callers
// hold w.mu.
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
	// CauseRemoved: the engine removed the block (BlockRemoved), or for a
	// keyed worker, its source did.
	CauseRemoved RemovalCause = iota + 1
	// CauseCapacity: the index evicted it beyond the worker's capacity
	// (or, for a keyed worker, its source dropped it).
	CauseCapacity
	// CauseBudget: the index evicted it for its memory budget.
	CauseBudget
)

// String names the cause.
func (c RemovalCause) String() string {
	switch c {
	case CauseRemoved:
		return "removed"
	case CauseCapacity:
		return "evicted for capacity"
	case CauseBudget:
		return "evicted for the memory budget"
	}
	return "unknown"
}

// Removal is one entry of a worker's removal record: a key that stopped
// being resident, why and when. The record is bounded (the most recent
// Config.RemovalHistory removals of blocks; clears and resets are kept as
// Stats.LastClearAt and LastResetAt, not per key), so that Diagnose can
// tell a block the worker removed lately from one it never stored. A key
// removed and stored again is resident, whatever the record says.
type Removal struct {
	Key   Key
	Cause RemovalCause
	At    time.Time
}

// DefaultRemovalHistory is the default Config.RemovalHistory: 16 bytes a
// removal, 4 KiB a worker.
const DefaultRemovalHistory = 256

// maxLoRAs bounds the adapters a worker's record keeps.
const maxLoRAs = 16

// history is a worker's removal record and the LoRA adapters it stored
// blocks under. Guarded by Worker.mu.
type history struct {
	ring  []removal // nil when off; allocated on the first removal
	size  int
	next  int // ring[next] is the oldest once full
	full  bool
	now   int64 // the current batch's time, 0 until the first removal of it
	loras []string
	// lorasOver counts adapters seen past maxLoRAs.
	lorasOver int
}

type removal struct {
	key   Key
	at    int64 // unix nanoseconds; the cause in its low 2 bits
	cause RemovalCause
}

func (h *history) init(n int) {
	switch {
	case n == 0:
		h.size = DefaultRemovalHistory
	case n > 0:
		h.size = n
	}
}

func (h *history) on() bool { return h.size > 0 }

// add records a removal. Cost: a ring write; a clock read once per batch.
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

// noteLoRA records an adapter the worker stored blocks under. Cost: a
// scan of at most maxLoRAs strings; a copy of the name the first time.
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

// FindRemoval returns the most recent record of k leaving the worker,
// and the number of removals the record holds. Cost: O(record) under the
// worker's mutex.
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

// LoRAs returns the LoRA adapters the worker has stored blocks under (at
// most 16, in the order first seen), and whether more were seen than kept.
func (w *Worker) LoRAs() ([]string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.hist.loras), w.hist.lorasOver > 0
}

// Applied is what an observer is told after a worker applied something:
// exactly one of Batch, Reset, Delta and Restore is set.
type Applied struct {
	// Batch is the engine batch applied; it is the caller's and valid only
	// during the call.
	Batch *events.Batch
	// Reset is the reason of a reset ("" otherwise).
	Reset string
	// Delta is the delta a keyed worker applied; valid only during the
	// call.
	Delta *Delta
	// Restore is set when the worker was rebuilt whole: a keyed worker
	// from a snapshot (Restore), a worker fed engine events from a
	// checkpoint (RestoreCheckpoint).
	Restore *Restored
}

// Restored describes a restore an observer is told of.
type Restored struct {
	// From is "snapshot" or "checkpoint".
	From string
	// Blocks are the worker's resident blocks after it.
	Blocks int64
}

// restoredLocked is what unlockThen does after a restore from from.
// Callers hold w.mu.
func (w *Worker) restoredLocked(from string) after {
	return after{apply: true, tell: true, what: Applied{Restore: &Restored{From: from, Blocks: w.res}}}
}

// Observer is told of every batch, reset and delta a worker applies, after
// it is applied, on the applying goroutine with no index lock held. It
// must not block or retain its arguments: an observer that needs them
// later copies what it needs and hands it over without waiting.
type Observer func(w *Worker, a *Applied)

type observer struct{ fn Observer }

// AddObserver adds fn to the index's observers and returns the function
// that removes it. Cost when no observer is set: one atomic load per
// applied batch; with observers, one call of each per batch.
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

// notify calls every observer in obs.
func (ix *Index) notify(obs []*observer, w *Worker, a *Applied) {
	for _, o := range obs {
		o.fn(w, a)
	}
}
