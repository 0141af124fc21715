package indexer

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/events"
)

// Errors the index returns, wrapped with the worker, event and values at fault.
var (
	// ErrUnknownModel: a worker or request names a model that was never added.
	ErrUnknownModel = errors.New("indexer: unknown model")
	// ErrDuplicateWorker: a worker was added twice.
	ErrDuplicateWorker = errors.New("indexer: worker already added")
	// ErrBlockSize: an event's block_size differs from its model's.
	ErrBlockSize = errors.New("indexer: block size mismatch")
	// ErrTokenCount: a BlockStored event's token_ids do not cover its blocks.
	ErrTokenCount = errors.New("indexer: token count does not match blocks")
	// ErrOrphan: a BlockStored event names a parent the worker never stored.
	ErrOrphan = errors.New("indexer: unknown parent block")
	// ErrUnknownBlock: a removal or offload event names a block the worker does not hold.
	ErrUnknownBlock = errors.New("indexer: unknown block")
	// ErrUnknownMedium: an event names a medium kvindex does not know; it is indexed as OTHER.
	ErrUnknownMedium = errors.New("indexer: unknown medium")
)

// WorkerID is a worker's dense index in one Index, assigned by AddWorker.
type WorkerID uint32

// WorkerInfo describes a worker when it is added.
type WorkerInfo struct {
	// Ref is the worker's identity (pod, DP rank).
	Ref events.WorkerRef
	// Model is the model the worker serves; it must have been added.
	Model string
	// Endpoint is where its events come from, for display.
	Endpoint string
}

// Model is one model namespace of the index.
type Model struct {
	// Name is the served model name that requests use.
	Name string
	// BlockSize is tokens per KV block for every worker of the model.
	BlockSize int
	root      Key
}

// Config sets up an Index.
type Config struct {
	// Shards is the number of key shards, rounded up to a power of two;
	// 0 means 64.
	Shards int
}

// Index is the live residency index: which worker holds which content key
// on which medium, with reference counts, plus each worker's map from
// engine block hash to content key.
//
// # Concurrency
//
// All methods are safe for concurrent use. Residency is sharded by key, one
// RWMutex per shard; Match takes only read locks, and holds one shard lock
// at a time, so a Score never waits on ingest of keys in other shards. Each
// worker's events are applied under that worker's own mutex; lock order is
// worker.mu, then a shard's mu (never two shards at once). Registration
// (models, workers) is guarded by Index.mu.
type Index struct {
	shards []shard
	mask   uint64

	mu      sync.RWMutex // guards models and workers
	models  map[string]*Model
	workers []*Worker

	positions sync.Pool // *[]int32 scratch for Match, indexed by WorkerID
}

// shard holds the residency of keys whose hash falls into it.
type shard struct {
	mu sync.RWMutex // guards m
	m  map[Key][]holder
	_  [40]byte // keep neighbouring shards' locks off one cache line
}

// holder is one worker's residency of a key, counted per medium: vLLM may
// store the same block twice, and each store needs its own removal.
type holder struct {
	w    WorkerID
	refs [events.NumMedia]uint32
}

func (h *holder) empty() bool {
	for _, r := range h.refs {
		if r != 0 {
			return false
		}
	}
	return true
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
		shards: make([]shard, n),
		mask:   uint64(n - 1),
		models: make(map[string]*Model),
	}
	for i := range ix.shards {
		ix.shards[i].m = make(map[Key][]holder)
	}
	return ix
}

func (ix *Index) shardOf(k Key) *shard {
	// Keys are xxh3 outputs, so their low bits are uniform already.
	return &ix.shards[uint64(k)&ix.mask]
}

// AddModel registers a model namespace with its block size. Adding the
// same model again with the same block size is a no-op.
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
		if m.BlockSize != blockSize {
			return nil, fmt.Errorf("%w: model %q has block size %d, not %d", ErrBlockSize, name, m.BlockSize, blockSize)
		}
		return m, nil
	}
	m := &Model{Name: name, BlockSize: blockSize, root: RootKey(name, "")}
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

// AddWorker registers a worker of an added model and returns its handle,
// which is the events.Sink its subscriber feeds.
func (ix *Index) AddWorker(info WorkerInfo) (*Worker, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	m, ok := ix.models[info.Model]
	if !ok {
		return nil, fmt.Errorf("%w %q for worker %s", ErrUnknownModel, info.Model, info.Ref)
	}
	for _, w := range ix.workers {
		if w.info.Ref == info.Ref {
			return nil, fmt.Errorf("%w: %s", ErrDuplicateWorker, info.Ref)
		}
	}
	w := &Worker{
		id:     WorkerID(len(ix.workers)),
		info:   info,
		model:  m,
		ix:     ix,
		engine: make(map[uint64]*engineEntry),
	}
	ix.workers = append(ix.workers, w)
	return w, nil
}

// Worker returns the worker with the given id, or nil.
func (ix *Index) Worker(id WorkerID) *Worker {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if int(id) < len(ix.workers) {
		return ix.workers[id]
	}
	return nil
}

// LookupWorker returns the worker named ref, or nil.
func (ix *Index) LookupWorker(ref events.WorkerRef) *Worker {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for _, w := range ix.workers {
		if w.info.Ref == ref {
			return w
		}
	}
	return nil
}

// Workers returns every worker in id order.
func (ix *Index) Workers() []*Worker {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return append([]*Worker(nil), ix.workers...)
}

// addResidency counts one more store of key on worker w in medium m.
func (ix *Index) addResidency(k Key, w WorkerID, m events.Medium) {
	sh := ix.shardOf(k)
	sh.mu.Lock()
	hs := sh.m[k]
	for i := range hs {
		if hs[i].w == w {
			hs[i].refs[m]++
			sh.mu.Unlock()
			return
		}
	}
	h := holder{w: w}
	h.refs[m] = 1
	sh.m[k] = append(hs, h)
	sh.mu.Unlock()
}

// dropResidency removes n stores of key on worker w in medium m (all of
// them when n is 0).
func (ix *Index) dropResidency(k Key, w WorkerID, m events.Medium, n uint32) {
	sh := ix.shardOf(k)
	sh.mu.Lock()
	hs := sh.m[k]
	for i := range hs {
		if hs[i].w != w {
			continue
		}
		if n == 0 || hs[i].refs[m] <= n {
			hs[i].refs[m] = 0
		} else {
			hs[i].refs[m] -= n
		}
		if hs[i].empty() {
			last := len(hs) - 1
			hs[i] = hs[last]
			hs = hs[:last]
			if len(hs) == 0 {
				delete(sh.m, k)
			} else {
				sh.m[k] = hs
			}
		}
		break
	}
	sh.mu.Unlock()
}

// Match is one worker's longest resident prefix of a prompt.
type Match struct {
	// Worker is the worker's id.
	Worker WorkerID
	// Blocks is the number of consecutive blocks from the start of the
	// prompt that the worker holds in any medium.
	Blocks int
	// ByMedium[m] is the number of consecutive blocks from the start held in
	// medium m alone.
	ByMedium [events.NumMedia]int
}

// Match appends to dst, for every worker that allow accepts (nil accepts
// all) and that holds at least the first key, its longest consecutive
// resident prefix of keys. Workers appear in the order they were first met.
//
// Cost: one shard read-lock and map probe per block of the matched prefix,
// plus O(holders) per block; the walk stops at the first block that no
// still-matching worker holds. No allocation when dst has capacity.
func (ix *Index) Match(keys []Key, allow func(WorkerID) bool, dst []Match) []Match {
	if len(keys) == 0 {
		return dst
	}
	base := len(dst)
	ix.mu.RLock()
	nworkers := len(ix.workers)
	ix.mu.RUnlock()
	pp, _ := ix.positions.Get().(*[]int32)
	if pp == nil {
		pp = new([]int32)
	}
	pos := *pp
	if len(pos) < nworkers {
		pos = make([]int32, nworkers+nworkers/4+8)
		for i := range pos {
			pos[i] = -1
		}
	}
	active := 0
	for i, k := range keys {
		sh := ix.shardOf(k)
		sh.mu.RLock()
		hs := sh.m[k]
		extended := false
		for j := range hs {
			h := &hs[j]
			if int(h.w) >= len(pos) {
				continue // a worker added after this call began
			}
			if i == 0 {
				if allow != nil && !allow(h.w) {
					continue
				}
				mt := Match{Worker: h.w, Blocks: 1}
				for m, r := range h.refs {
					if r > 0 {
						mt.ByMedium[m] = 1
					}
				}
				pos[h.w] = int32(len(dst))
				dst = append(dst, mt)
				extended = true
				continue
			}
			p := pos[h.w]
			if p < 0 || dst[p].Blocks != i {
				continue
			}
			mt := &dst[p]
			mt.Blocks = i + 1
			for m, r := range h.refs {
				if r > 0 && mt.ByMedium[m] == i {
					mt.ByMedium[m] = i + 1
				}
			}
			extended = true
		}
		sh.mu.RUnlock()
		if i == 0 {
			active = len(dst) - base
		}
		if !extended || active == 0 {
			break
		}
	}
	for _, mt := range dst[base:] {
		pos[mt.Worker] = -1
	}
	*pp = pos
	ix.positions.Put(pp)
	return dst
}

// Stats are one worker's index-side counters, read by ListWorkers and
// exported as metrics.
type Stats struct {
	// ResidentBlocks is the number of engine blocks the worker holds in any medium.
	ResidentBlocks int64
	// ResidentByMedium counts resident blocks per medium.
	ResidentByMedium [events.NumMedia]int64
	// BlocksStored and BlocksRemoved count applied block stores and removals.
	BlocksStored, BlocksRemoved int64
	// Orphans counts stored blocks whose parent the worker never announced;
	// they are indexed under keys no prompt can match.
	Orphans int64
	// UnknownBlocks counts removals or offloads of blocks the worker did not hold.
	UnknownBlocks int64
	// BlockSizeMismatches counts events whose block_size differs from the model's.
	BlockSizeMismatches int64
	// InvalidEvents counts other events that could not be applied.
	InvalidEvents int64
	// SkippedGroupEvents counts events of KV-cache groups that do not decide
	// prefix reuse (sliding window, mamba), which are not indexed.
	SkippedGroupEvents int64
	// Clears counts AllBlocksCleared events; Resets counts forced resets
	// (engine restarts).
	Clears, Resets int64
	// LastReset is why the worker was last reset, "" if never.
	LastReset string
	// LastApply is when a batch was last applied (zero if never).
	LastApply time.Time
}

// counters are a worker's Stats as atomics.
type counters struct {
	resident                  atomic.Int64
	residentByMedium          [events.NumMedia]atomic.Int64
	stored, removed           atomic.Int64
	orphans, unknown          atomic.Int64
	blockSize, invalid, group atomic.Int64
	clears, resets            atomic.Int64
	lastApply                 atomic.Int64 // unix nanoseconds
}
