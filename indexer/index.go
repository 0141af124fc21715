package indexer

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// Errors the index returns, wrapped with the worker, event and values at fault.
var (
	ErrUnknownModel    = errors.New("indexer: unknown model")
	ErrDuplicateWorker = errors.New("indexer: worker already added")
	ErrBlockSize       = errors.New("indexer: block size mismatch")               // an event's block_size differs from its model's.
	ErrTokenCount      = errors.New("indexer: token count does not match blocks") // BlockStored's token_ids do not cover its blocks.
	ErrOrphan          = errors.New("indexer: unknown parent block")              // BlockStored names a parent never stored.
	ErrUnknownBlock    = errors.New("indexer: unknown block")                     // a removal or offload of a block not held.
	ErrUnknownMedium   = errors.New("indexer: unknown medium")                    // an event's Medium is no events.Medium value.
	ErrUnknownWorker   = errors.New("indexer: unknown worker")                    // not in the index.
	ErrRemovedWorker   = errors.New("indexer: worker was removed")                // a removed worker's handle was called.
	ErrWorkerKind      = errors.New("indexer: wrong kind of worker")              // see Worker, Kinds.
	ErrDeltaMismatch   = errors.New("indexer: delta does not fit the worker")     // the worker needs a new snapshot.
	ErrBadSnapshot     = errors.New("indexer: bad snapshot")                      // nothing of it was applied.
)

// WorkerID is a worker's dense index in one Index. A removed worker's id is
// reused with the next generation (Worker.Gen): (WorkerID, generation)
// names one worker for the index's lifetime.
type WorkerID uint32

// WorkerInfo describes a worker when it is added.
type WorkerInfo struct {
	Ref      events.WorkerRef // the worker's identity (pod, DP rank).
	Model    string           // the model the worker serves; it must have been added.
	Endpoint string           // where its events come from, for display.
	// Keyed makes the worker a replica of another index's worker (see
	// Worker, Kinds); it has no capacity of its own, but the memory budget
	// evicts from it as from any worker.
	Keyed bool
}

// Model is one model namespace of the index. Its block size, the one
// prompts are keyed at, is learned from its workers' events (see
// Model.BlockSize).
type Model struct {
	Name       string // the served model name that requests use.
	configured int    // the block size it was added with
	bs         atomic.Int32
	root       Key

	mu    sync.Mutex  // guards sizes
	sizes map[int]int // prefix block size -> its workers that announce it
}

// Config sets up an Index.
type Config struct {
	Shards int // the number of shards of the node index (heads), rounded up to a power of two; 0 means 64.
	// WorkerCapacity bounds the blocks one worker may hold in all media;
	// beyond it the least recently stored are evicted and counted
	// (Stats.Evictions), for removals that were lost. 0 learns each
	// worker's capacity (see Worker.SetCapacity); negative is unbounded.
	WorkerCapacity int
	// RemovalHistory is how many removals each worker's record keeps (see
	// Removal); 0 means DefaultRemovalHistory, negative keeps none.
	RemovalHistory int
	// MemoryBudget bounds the estimated memory in bytes
	// (EstimatedBytesPerBlock per resident block); beyond it the workers
	// holding the most are evicted from (Stats.BudgetEvictions). 0 means
	// unbounded.
	MemoryBudget int64
}

// EstimatedBytesPerBlock is what the memory budget charges per resident
// (block, worker): the measured 23 to 28 bytes (BenchmarkMemory10M), with
// room for an engine map just grown and dead keys kept in runs.
const EstimatedBytesPerBlock = 32

// Index is the live residency index: which worker holds which content key
// on which medium (see the package documentation and node), plus each
// worker's map from engine block hash to its place.
//
// # Concurrency
//
// All methods are safe for concurrent use. Match takes no lock on the
// tree (views and holder sets are immutable, published through atomic
// pointers); it takes one heads shard's read lock per node it enters, for
// one map probe, and never waits on a worker's batch.
//
// Each worker's events are applied under its mutex; writers share nodes
// through per-node mutexes. Lock order: Worker.mu, then node locks from the
// root down (at most a node and its child), then one heads shard. Index.mu
// guards registration and is never held with the others. A batch's changes
// are visible to Match when its ApplyBatch returns (parts may be earlier).
type Index struct {
	heads []headShard
	mask  uint64
	nodes nodeTable

	mu     sync.RWMutex // guards models, byRef, gens, freeIDs, and adding and removing workers
	models map[string]*Model
	byRef  map[events.WorkerRef]*Worker
	// gens[id] is the generation the next worker with that id gets.
	gens    []uint32
	freeIDs []WorkerID // ids of removed workers, oldest first.
	// workers is the worker table by id (nil for free ids), copied on
	// change so that readers load it without a lock.
	workers atomic.Pointer[[]*Worker]
	version atomic.Uint64 // bumped by AddWorker and RemoveWorker

	cfg          Config
	budgetBlocks int64        // MemoryBudget / EstimatedBytesPerBlock, 0 without a budget
	resident     atomic.Int64 // resident blocks over all workers
	budgetMu     sync.Mutex   // one budget enforcer at a time (TryLock)
	collisions   atomic.Int64 // 64-bit key collisions met (kept out of heads)

	observers  atomic.Pointer[[]*observer] // see AddObserver; nil when there are none.
	observerMu sync.Mutex                  // serialises AddObserver and its removals

	singleFn holders.Singletons // ix.single, bound once
	scratch  sync.Pool          // *matchScratch
}

// New returns an empty index.
func New(cfg Config) *Index {
	n := 64
	if cfg.Shards > 0 {
		n = 1
		for n < cfg.Shards {
			n <<= 1
		}
	}
	ix := &Index{
		heads:  make([]headShard, n),
		mask:   uint64(n - 1),
		models: make(map[string]*Model),
		byRef:  make(map[events.WorkerRef]*Worker),
		cfg:    cfg,
	}
	if cfg.MemoryBudget > 0 {
		ix.budgetBlocks = max(cfg.MemoryBudget/EstimatedBytesPerBlock, 1)
	}
	for i := range ix.heads {
		ix.heads[i].m = make(map[Key]*node)
	}
	ix.workers.Store(new([]*Worker))
	ix.singleFn = ix.single
	return ix
}

// single returns the interned one-worker holder set of (w, media).
func (ix *Index) single(w uint32, media uint8) *holders.Set {
	wk := (*ix.workers.Load())[w]
	p := &wk.singles[media&(1<<events.NumMedia-1)]
	if s := p.Load(); s != nil {
		return s
	}
	s := holders.New([]holders.Entry{holders.MakeEntry(w, media)})
	if p.CompareAndSwap(nil, s) {
		return s
	}
	return p.Load()
}

// AddModel registers a model namespace with its block size; adding it
// again with the same block size is a no-op.
func (ix *Index) AddModel(name string, blockSize int) (*Model, error) {
	if name == "" {
		return nil, fmt.Errorf("indexer: add model: empty name")
	}
	if blockSize <= 0 {
		return nil, fmt.Errorf("indexer: add model %q: block size %d must be positive", name, blockSize)
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if m, ok := ix.models[name]; ok {
		if m.configured != blockSize {
			return nil, fmt.Errorf("%w: model %q has block size %d, not %d", ErrBlockSize, name, m.configured, blockSize)
		}
		return m, nil
	}
	m := newModel(name, blockSize)
	ix.models[name] = m
	return m, nil
}

// Model returns the named model, or nil and false.
func (ix *Index) Model(name string) (*Model, bool) {
	ix.mu.RLock()
	m, ok := ix.models[name]
	ix.mu.RUnlock()
	return m, ok
}

// Models returns every registered model.
func (ix *Index) Models() []*Model {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]*Model, 0, len(ix.models))
	for _, m := range ix.models {
		out = append(out, m)
	}
	return out
}

// AddWorker registers a worker of an added model and returns its handle
// (the events.Sink its subscriber feeds). It reuses the longest-free id of
// a removed worker, with the next generation, else takes a new id.
func (ix *Index) AddWorker(info WorkerInfo) (*Worker, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	m, ok := ix.models[info.Model]
	if !ok {
		return nil, fmt.Errorf("%w %q for worker %s", ErrUnknownModel, info.Model, info.Ref)
	}
	if ix.byRef[info.Ref] != nil {
		return nil, fmt.Errorf("%w: %s", ErrDuplicateWorker, info.Ref)
	}
	ws := *ix.workers.Load()
	var id WorkerID
	if len(ix.freeIDs) > 0 {
		id = ix.freeIDs[0]
		ix.freeIDs = ix.freeIDs[1:]
	} else {
		if len(ws) > holders.MaxWorker {
			return nil, fmt.Errorf("indexer: add worker %s: the index holds its maximum of %d workers", info.Ref, holders.MaxWorker+1)
		}
		id = WorkerID(len(ws))
		ix.gens = append(ix.gens, 0)
	}
	w := &Worker{
		id:     id,
		gen:    ix.gens[id],
		info:   info,
		model:  m,
		ix:     ix,
		anchor: -1,
	}
	w.cur.ix = ix
	w.hist.size = max(ix.cfg.RemovalHistory, 0)
	if ix.cfg.RemovalHistory == 0 {
		w.hist.size = DefaultRemovalHistory
	}
	if ix.cfg.WorkerCapacity != 0 {
		w.capConfigured = int64(max(ix.cfg.WorkerCapacity, -1))
	}
	w.c.capacity.Store(w.capacityLocked())
	nws := make([]*Worker, max(len(ws), int(id)+1))
	copy(nws, ws)
	nws[id] = w
	ix.byRef[info.Ref] = w
	ix.workers.Store(&nws)
	ix.version.Add(1)
	return w, nil
}

// RemoveWorker forgets the worker named ref: its blocks leave the index,
// and its handle refuses further events with ErrRemovedWorker. Its id is
// freed for a later AddWorker under the next generation (Worker.Gen).
//
// The id is freed only after the clear is published, so a Match that
// starts after RemoveWorker returns cannot report the old worker's blocks
// under it; a Match already running may, and callers that resolve ids
// through a table taken before the Match (as scoring does) then name the
// removed worker, never its successor. Cost: O(the worker's blocks).
func (ix *Index) RemoveWorker(ref events.WorkerRef) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	w := ix.byRef[ref]
	if w == nil {
		return fmt.Errorf("%w: %s", ErrUnknownWorker, ref)
	}
	w.retire()
	ws := *ix.workers.Load()
	nws := make([]*Worker, len(ws))
	copy(nws, ws)
	nws[w.id] = nil
	delete(ix.byRef, ref)
	ix.workers.Store(&nws)
	ix.gens[w.id]++
	ix.freeIDs = append(ix.freeIDs, w.id)
	ix.version.Add(1)
	return nil
}

// Apply applies a batch to the worker named ref (see Worker.ApplyBatch).
func (ix *Index) Apply(ref events.WorkerRef, b *events.Batch) error {
	w := ix.LookupWorker(ref)
	if w == nil {
		return fmt.Errorf("%w: %s", ErrUnknownWorker, ref)
	}
	return w.ApplyBatch(b)
}

// Worker returns the worker with the given id, or nil.
func (ix *Index) Worker(id WorkerID) *Worker {
	ws := *ix.workers.Load()
	if int(id) < len(ws) {
		return ws[id]
	}
	return nil
}

// LookupWorker returns the worker named ref, or nil.
func (ix *Index) LookupWorker(ref events.WorkerRef) *Worker {
	ix.mu.RLock()
	w := ix.byRef[ref]
	ix.mu.RUnlock()
	return w
}

// Workers returns every current worker in id order.
func (ix *Index) Workers() []*Worker {
	ws := *ix.workers.Load()
	out := make([]*Worker, 0, len(ws))
	for _, w := range ws {
		if w != nil {
			out = append(out, w)
		}
	}
	return out
}

// NumWorkers returns the bound on worker ids (free ids are reused before
// it grows).
func (ix *Index) NumWorkers() int { return len(*ix.workers.Load()) }

// Version changes whenever a worker is added or removed, for caches of the
// worker table.
func (ix *Index) Version() uint64 { return ix.version.Load() }

// Match is one worker's longest resident prefix of a prompt.
type Match struct {
	Worker WorkerID
	// Blocks is the number of consecutive blocks from the start of the
	// prompt that the worker holds in any medium.
	Blocks int
	// ByMedium[m] is the same count for medium m alone.
	ByMedium [events.NumMedia]int
	// Prefix is, when a side group capped Blocks (Worker.Cap, applied by
	// the scorer), the worker's prefix group's own match, else 0; CappedBy
	// is then the capping group's index.
	Prefix, CappedBy int
}

// Match appends to dst, for every worker that allow accepts (nil accepts
// all) and that holds at least the first key, its longest consecutive
// resident prefix of keys (a prompt's keys from its first block, as
// PromptKeys computes them). Workers added after the call began may be
// left out. allow is called once per holder of the first key, with no lock
// held.
//
// Cost: O(matched keys + holders of the first key + holder-set changes),
// not O(keys x workers): runs are compared four keys at a time, a holder
// set is looked at only where it changes (a merge with the still-matching
// workers, O(a + h), or O(a log h) when a < h/8), and heads is probed once
// per node entered. No allocation when dst has capacity (BenchmarkScoreFloor,
// BenchmarkScore4096x1000: docs/benchmarks.md).
func (ix *Index) Match(keys []Key, allow func(WorkerID) bool, dst []Match) []Match {
	dst, _ = ix.match(keys, allow, dst, nil)
	return dst
}

// match is the one walk of keys down the tree, for Match and, with visit,
// for Lookup: each stretch [from, to) sharing one holder set goes to visit,
// else to the matcher. It returns dst and the number of leading keys the
// tree has.
func (ix *Index) match(keys []Key, allow func(WorkerID) bool, dst []Match, visit func(from, to int, set *holders.Set) bool) ([]Match, int) {
	if len(keys) == 0 {
		return dst, 0
	}
	n := ix.head(keys[0])
	if n == nil || n.parent != nil {
		return dst, 0
	}
	// Kept out of m, whose dst escapes (escape analysis does not tell
	// fields apart): small stays in this frame.
	var small [matchSmall]active
	act := small[:0]
	m := matcher{ix: ix, dst: dst, allow: allow}
	i := 0
walk:
	for {
		v := n.view.Load()
		if v == nil {
			break
		}
		start := i // blocks [start, i) are the node's keys [0, j)
		var j int
		i, j = matchRun(keys, i, v.keys[:v.n.Load()], 0)
		if i == start {
			break
		}
		segs := v.segs
		for s := 0; s < len(segs) && int(segs[s].start) < j; s++ {
			from := start + int(segs[s].start)
			if visit != nil {
				to := start + j
				if s+1 < len(segs) && int(segs[s+1].start) < j {
					to = start + int(segs[s+1].start)
				}
				if !visit(from, to, segs[s].set) {
					break walk
				}
				continue
			}
			var more bool
			if act, more = m.at(act, from, segs[s].set); !more {
				break walk
			}
		}
		if i == len(keys) {
			break
		}
		c := ix.head(keys[i])
		if c == nil || c.parent != n || int(c.attach) != j-1 {
			break
		}
		n = c
	}
	return m.finish(act, i), i
}

// matchRun advances i in keys and j in run while their keys are equal,
// four per branch.
func matchRun(keys []Key, i int, run []Key, j int) (int, int) {
	for i+4 <= len(keys) && j+4 <= len(run) {
		a, b := keys[i:i+4:i+4], run[j:j+4:j+4]
		if (a[0]^b[0])|(a[1]^b[1])|(a[2]^b[2])|(a[3]^b[3]) != 0 {
			break
		}
		i, j = i+4, j+4
	}
	for i < len(keys) && j < len(run) && keys[i] == run[j] {
		i, j = i+1, j+1
	}
	return i, j
}

type matchScratch struct {
	act []active
}

// matchSmall is how many still-matching workers a Match tracks in its own
// frame; beyond it a pool round trip costs about 15 ns.
const matchSmall = 16

// active is a worker still matching: its entry with the media bits clear
// (so it sorts by worker), its Match in dst, and the media of its whole
// match so far.
type active struct {
	key   holders.Entry
	di    int32
	media uint8
}

// matcher follows the holder sets along the matched keys; act stays
// sorted by worker, as sets are.
type matcher struct {
	ix     *Index
	dst    []Match
	allow  func(WorkerID) bool
	cur    *holders.Set
	inited bool
	sc     *matchScratch // when the first set has over matchSmall holders
}

// at records that blocks from b on are held by s, and returns the workers
// still matching and whether there are any.
func (m *matcher) at(act []active, b int, s *holders.Set) ([]active, bool) {
	if !m.inited {
		m.inited = true
		m.cur = s
		ents := s.Entries()
		if len(ents) > cap(act) {
			m.sc, _ = m.ix.scratch.Get().(*matchScratch)
			if m.sc == nil {
				m.sc = new(matchScratch)
			}
			m.sc.act = slices.Grow(m.sc.act[:0], len(ents))
			act = m.sc.act
		}
		for _, e := range ents {
			w := e.Worker()
			if m.allow != nil && !m.allow(WorkerID(w)) {
				continue
			}
			act = append(act, active{key: holders.MakeEntry(w, 0), di: int32(len(m.dst)), media: e.Media()})
			m.dst = append(m.dst, Match{Worker: WorkerID(w)})
		}
		return act, len(act) > 0
	}
	if s == m.cur || holders.Equal(s, m.cur) {
		return act, true
	}
	m.cur = s
	ents := s.Entries()
	keep := 0
	// An active is copied down only once a worker before it has ended.
	if len(act)*8 < len(ents) { // few among many holders: look each up
		for i := range act {
			a := &act[i]
			if m.keep(a, s.Media(a.key.Worker()), b) {
				if keep != i {
					act[keep] = *a
				}
				keep++
			}
		}
	} else {
		k := 0 // merge: both are sorted by worker
		for i := range act {
			a := &act[i]
			for k < len(ents) && ents[k] < a.key {
				k++
			}
			var media uint8
			if k < len(ents) && ents[k]&^0xff == a.key {
				media = ents[k].Media()
				k++
				if media == a.media { // the common case, inline
					if keep != i {
						act[keep] = *a
					}
					keep++
					continue
				}
			}
			if m.keep(a, media, b) {
				if keep != i {
					act[keep] = *a
				}
				keep++
			}
		}
	}
	return act[:keep], keep > 0
}

// keep applies a worker's media at block b and reports whether it still
// matches; a match (or a medium's) ends at the first block it lacks.
func (m *matcher) keep(a *active, media uint8, b int) bool {
	if media == a.media && media != 0 {
		return true
	}
	d := &m.dst[a.di]
	if media == 0 {
		d.Blocks = b
		setMedia(d, a.media, b)
		return false
	}
	if lost := a.media &^ media; lost != 0 {
		setMedia(d, lost, b)
		a.media &= media
	}
	return true
}

// setMedia sets d.ByMedium[m] = b for every medium m in mask.
func setMedia(d *Match, mask uint8, b int) {
	for mask != 0 {
		i := bits.TrailingZeros8(mask)
		d.ByMedium[i] = b
		mask &= mask - 1
	}
}

// finish ends the matches still running at block b and returns dst.
func (m *matcher) finish(act []active, b int) []Match {
	for _, a := range act {
		d := &m.dst[a.di]
		d.Blocks = b
		setMedia(d, a.media, b)
	}
	if m.sc != nil {
		m.ix.scratch.Put(m.sc)
	}
	return m.dst
}

// Stats are one worker's index-side counters.
type Stats struct {
	ResidentBlocks   int64                  // the number of engine blocks the worker holds in any medium.
	ResidentByMedium [events.NumMedia]int64 // counts resident blocks per medium.
	// BlocksStored and BlocksRemoved count applied block stores and removals.
	BlocksStored, BlocksRemoved int64
	Orphans                     int64 // counts stored blocks whose parent the worker never announced.
	UnknownBlocks               int64 // counts removals or offloads of blocks the worker did not hold.
	BlockSizeMismatches         int64 // counts prefix-group stores whose block_size differs from the model's (indexed at their own).
	InvalidEvents               int64 // counts other events that could not be applied.
	SkippedGroupEvents          int64 // counts events of KV-cache groups of kinds kvindex does not model (Group.Class ClassOther).
	// UnknownGroupBlocks counts blocks removed from a KV-cache group the
	// worker never saw stored (nothing was touched).
	UnknownGroupBlocks int64
	// LayoutChanges counts stores refused for describing a group that
	// holds blocks anew (another kind, window or block size).
	LayoutChanges int64
	// SideBlocks are the blocks held by the worker's side groups (window,
	// mamba and other prefix groups), which cap its hits (Worker.Cap);
	// SideRefused counts side blocks refused beyond a group's bound.
	SideBlocks, SideRefused int64
	// BlockSize is the block size of the worker's prefix group as its
	// events announce it, 0 until a store; it may differ from its model's
	// (Model.BlockSize), which flags the worker.
	BlockSize int
	// Clears counts AllBlocksCleared events, Resets forced resets.
	Clears, Resets int64
	// Evictions counts blocks dropped without a removal event (capacity
	// or budget); BudgetEvictions those for the memory budget.
	Evictions, BudgetEvictions int64
	DeltaMismatches            int64     // counts delta effects skipped (see Worker.ApplyDelta).
	Capacity                   int64     // the worker's capacity (see Worker.SetCapacity); 0 while unbounded.
	LastReset                  string    // why the worker was last reset, "" if never.
	LastApply                  time.Time // when a batch was last applied (zero if never).
	// LastResetAt and LastClearAt are the last reset and AllBlocksCleared
	// (zero if never).
	LastResetAt, LastClearAt time.Time
	LastBadBlockSize         int // the last mismatched event block_size (0 if none).
}

// counters are a worker's Stats as atomics.
type counters struct {
	resident                    atomic.Int64
	residentByMedium            [events.NumMedia]atomic.Int64
	stored, removed             atomic.Int64
	orphans, unknown            atomic.Int64
	blockSize, invalid, group   atomic.Int64
	unknownGroup, layoutChanges atomic.Int64
	sideBlocks, sideRefused     atomic.Int64
	clears, resets              atomic.Int64
	evictions, budgetEvict      atomic.Int64
	deltaMismatches             atomic.Int64
	capacity                    atomic.Int64
	lastApply                   atomic.Int64 // unix nanoseconds
	lastResetAt, lastClearAt    atomic.Int64 // unix nanoseconds, 0 if never
	lastBadBlockSize            atomic.Int64 // the last mismatched event block_size
}

// checkBudget evicts from the workers holding the most while the estimate
// exceeds Config.MemoryBudget, down to 31/32 of it. One goroutine enforces
// at a time (TryLock on budgetMu).
func (ix *Index) checkBudget() {
	if ix.budgetBlocks == 0 || ix.resident.Load() <= ix.budgetBlocks {
		return
	}
	if !ix.budgetMu.TryLock() {
		return
	}
	defer ix.budgetMu.Unlock()
	target := ix.budgetBlocks - ix.budgetBlocks/32
	for {
		over := ix.resident.Load() - target
		if over <= 0 {
			return
		}
		var big *Worker
		var first, second int64
		for _, w := range *ix.workers.Load() {
			if w == nil {
				continue
			}
			switch r := w.c.resident.Load(); {
			case r > first:
				big, first, second = w, r, first
			case r > second:
				second = r
			}
		}
		if big == nil {
			return
		}
		// Down to the runner-up, in chunks, so its events wait little.
		if big.evictForBudget(min(over, max(first-second, 1), 4096)) == 0 {
			return
		}
	}
}
