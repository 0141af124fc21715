package scoring

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/quote"
	"github.com/kvindex/kvindex/internal/tick"
)

// Errors of Tracker.Record and Release.
var (
	ErrDuplicateRequest = errors.New("scoring: request id already in flight")
	ErrTooManyFlights   = errors.New("scoring: too many requests in flight") // see TrackerOptions.MaxFlights
	ErrNotOwner         = errors.New("scoring: request routed by another client")
)

// Tracker remembers routing decisions: a request's uncached prefill counts
// as its worker's in-flight load until Release or FlightTTL, and its blocks
// as speculatively cached there until Release or SpecTTL, since BlockStored
// arrives only once the engine schedules the prefill; once the prefill is
// done its blocks were announced, and speculating longer would credit
// blocks the engine has since evicted. Workers are named by (WorkerID,
// generation), so a reused id never inherits load.
//
// # Concurrency
//
// All methods are safe for concurrent use. Load is atomic loads of
// per-worker cells published through an atomic pointer. Flights are in
// maps by request id, each shard under a mutex taken for one map
// operation; speculative entries are in maps by the prompt's first key,
// each shard under an RWMutex (Speculative: one read-locked probe; Sweep
// write-locks only to delete what expired). No lock is held while calling
// out, and across shards only in Record, which takes the speculative
// shard's lock under the flight shard's (the one order of the two).
type Tracker struct {
	specTTL, flightTTL time.Duration
	maxFlights         int64
	maxSpecKeys        int64
	now                func() time.Time
	seed               maphash.Seed

	flights [flightShards]flightShard
	spec    [specShards]specShard

	cellsMu sync.Mutex                    // guards growing cells
	cells   atomic.Pointer[[]*flightCell] // by WorkerID
	count   atomic.Int64                  // flights in all shards
	// specKeys is the keys speculative entries hold (bounded by
	// maxSpecKeys); refused and skipped count what the bounds turned away.
	specKeys         atomic.Int64
	refused, skipped atomic.Int64
	specSeq          atomic.Uint64 // the last speculative entry's id
}

// Shard counts: a sweep of one shard (1/64 of 100 k flights) holds its
// lock for tens of microseconds.
const (
	flightShards = 64
	specShards   = 64
)

type flightShard struct {
	mu sync.Mutex // guards m
	m  map[string]flight
	_  [40]byte // keep neighbouring shards' locks off one cache line
}

type specShard struct {
	mu sync.RWMutex // guards m
	m  map[indexer.Key][]specEntry
	_  [40]byte
}

// flight is one routed request until Release or expiry.
type flight struct {
	cell    *flightCell
	tokens  uint64
	expires time.Time
	owner   string // who routed it; only they may release it
	// spec is the speculative entry it holds (specRef.id 0: none).
	spec specRef
}

// specRef names a speculative entry: its prompt's first key, its worker
// generation and its id.
type specRef struct {
	first indexer.Key
	w     indexer.WorkerID
	gen   uint32
	id    uint64
}

// flightCell is one worker generation's in-flight totals.
type flightCell struct {
	gen      uint32
	requests atomic.Int64
	tokens   atomic.Int64
}

// specEntry is the longest recent prompt (by its first key) routed to one
// worker generation, held by the flights that routed there (flights)
// until they are released or it expires. id tells it from an earlier
// entry of the same worker that expired, whose flights no longer hold it.
type specEntry struct {
	w       indexer.WorkerID
	gen     uint32
	keys    []indexer.Key
	expires time.Time
	id      uint64
	flights int32
}

// Spec is one worker's speculative prefix of a prompt (Tracker.Speculative).
type Spec struct {
	Worker indexer.WorkerID
	Gen    uint32
	Blocks int // the length of the prefix it shares with the routed prompt.
}

// Defaults of TrackerOptions.
const (
	DefaultSpecTTL     = 10 * time.Second // longer than a queued prefill waits.
	DefaultFlightTTL   = 2 * time.Minute
	DefaultMaxFlights  = 1 << 17 // about 100 bytes a flight.
	DefaultMaxSpecKeys = 1 << 24 // 128 MiB.
)

// TrackerOptions configure a Tracker; a zero field means its default.
type TrackerOptions struct {
	SpecTTL     time.Duration    // how long routed blocks count as speculatively cached.
	FlightTTL   time.Duration    // how long a routed request counts as load without a Release.
	MaxFlights  int              // bounds the requests in flight; Record refuses more with ErrTooManyFlights, counted.
	MaxSpecKeys int              // past it a route is recorded without its speculative keys, counted.
	Now         func() time.Time // the clock; nil means time.Now.
}

// NewTracker returns a tracker.
func NewTracker(o TrackerOptions) *Tracker {
	if o.SpecTTL <= 0 {
		o.SpecTTL = DefaultSpecTTL
	}
	if o.FlightTTL <= 0 {
		o.FlightTTL = DefaultFlightTTL
	}
	if o.MaxFlights <= 0 {
		o.MaxFlights = DefaultMaxFlights
	}
	if o.MaxSpecKeys <= 0 {
		o.MaxSpecKeys = DefaultMaxSpecKeys
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	t := &Tracker{specTTL: o.SpecTTL, flightTTL: o.FlightTTL, maxFlights: int64(o.MaxFlights), maxSpecKeys: int64(o.MaxSpecKeys), now: o.Now, seed: maphash.MakeSeed()}
	for i := range t.flights {
		t.flights[i].m = make(map[string]flight)
	}
	for i := range t.spec {
		t.spec[i].m = make(map[indexer.Key][]specEntry)
	}
	t.cells.Store(new([]*flightCell))
	return t
}

func (t *Tracker) flightShard(id string) *flightShard {
	return &t.flights[maphash.String(t.seed, id)%flightShards]
}

func (t *Tracker) specShard(k indexer.Key) *specShard {
	// Keys are xxh3 outputs: their low bits are uniform.
	return &t.spec[uint64(k)%specShards]
}

// cell returns worker (w, gen)'s counters, replacing an older
// generation's. Cost: one atomic load, but for a new worker generation.
func (t *Tracker) cell(w indexer.WorkerID, gen uint32) *flightCell {
	if cs := *t.cells.Load(); int(w) < len(cs) {
		if c := cs[w]; c != nil && c.gen == gen {
			return c
		}
	}
	t.cellsMu.Lock()
	defer t.cellsMu.Unlock()
	cs := *t.cells.Load()
	if int(w) < len(cs) {
		if c := cs[w]; c != nil && c.gen == gen {
			return c
		}
	}
	ncs := make([]*flightCell, max(len(cs), int(w)+1))
	copy(ncs, cs)
	c := &flightCell{gen: gen}
	ncs[w] = c
	t.cells.Store(&ncs)
	return c
}

// Record notes that request id, routed by owner ("" when clients are not
// told apart), was sent to worker (w, gen) with the prompt's block keys
// (copied) and tokens uncached prefill tokens. It refuses a full table
// with ErrTooManyFlights.
func (t *Tracker) Record(id, owner string, w indexer.WorkerID, gen uint32, keys []indexer.Key, tokens uint64) error {
	now := t.now()
	c := t.cell(w, gen)
	sh := t.flightShard(id)
	sh.mu.Lock()
	if f, ok := sh.m[id]; ok {
		if now.Before(f.expires) {
			sh.mu.Unlock()
			return fmt.Errorf("%w: %s", ErrDuplicateRequest, quote.Q(id))
		}
		t.endLocked(sh, id, f)
	}
	if t.count.Add(1) > t.maxFlights {
		t.count.Add(-1)
		sh.mu.Unlock()
		t.refused.Add(1)
		return fmt.Errorf("%w: %d, the most the table holds (release requests when their prefill is done)", ErrTooManyFlights, t.maxFlights)
	}
	f := flight{cell: c, tokens: tokens, expires: now.Add(t.flightTTL), owner: owner}
	f.spec = t.speculate(w, gen, keys, now)
	sh.m[id] = f
	sh.mu.Unlock()
	c.requests.Add(1)
	c.tokens.Add(int64(tokens))
	return nil
}

// speculate makes keys speculatively cached on worker (w, gen) for
// SpecTTL from now, or the entry of a longer prompt with the same first
// key, and returns the entry it holds (id 0: none).
func (t *Tracker) speculate(w indexer.WorkerID, gen uint32, keys []indexer.Key, now time.Time) specRef {
	if len(keys) == 0 {
		return specRef{}
	}
	ss := t.specShard(keys[0])
	ss.mu.Lock()
	defer ss.mu.Unlock()
	es := ss.m[keys[0]]
	for i := range es {
		e := &es[i]
		if e.w != w || e.gen != gen {
			continue
		}
		live := now.Before(e.expires)
		if !live || len(keys) >= len(e.keys) {
			if !t.holdSpec(len(keys) - len(e.keys)) {
				return specRef{}
			}
			e.keys = append(e.keys[:0:0], keys...)
		}
		if !live {
			e.id, e.flights = t.specSeq.Add(1), 0
		}
		e.expires = now.Add(t.specTTL)
		e.flights++
		return specRef{first: keys[0], w: w, gen: gen, id: e.id}
	}
	if !t.holdSpec(len(keys)) {
		return specRef{}
	}
	e := specEntry{w: w, gen: gen, keys: append([]indexer.Key(nil), keys...), expires: now.Add(t.specTTL), id: t.specSeq.Add(1), flights: 1}
	ss.m[keys[0]] = append(es, e)
	return specRef{first: keys[0], w: w, gen: gen, id: e.id}
}

// unspeculate lets go of a released flight's entry, dropping it when no
// flight holds it any more.
func (t *Tracker) unspeculate(r specRef) {
	ss := t.specShard(r.first)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	es := ss.m[r.first]
	i := slices.IndexFunc(es, func(e specEntry) bool { return e.w == r.w && e.gen == r.gen && e.id == r.id })
	if i < 0 {
		return
	}
	if es[i].flights--; es[i].flights > 0 {
		return
	}
	t.specKeys.Add(-int64(len(es[i].keys)))
	es = slices.Delete(es, i, i+1)
	if len(es) == 0 {
		delete(ss.m, r.first)
	} else {
		ss.m[r.first] = es
	}
}

// holdSpec accounts n more speculative keys (n may be negative), or
// reports that they would exceed maxSpecKeys and counts the skip.
func (t *Tracker) holdSpec(n int) bool {
	if t.specKeys.Add(int64(n)) > t.maxSpecKeys && n > 0 {
		t.specKeys.Add(-int64(n))
		t.skipped.Add(1)
		return false
	}
	return true
}

// Release ends request id's in-flight accounting when owner routed it,
// and its speculative blocks unless a flight still in progress routed the
// same prompt there (call it once the prefill is done: its blocks are
// then announced); false if it is unknown or had expired, ErrNotOwner for
// another owner's.
func (t *Tracker) Release(id, owner string) (bool, error) {
	sh := t.flightShard(id)
	sh.mu.Lock()
	f, ok := sh.m[id]
	if !ok {
		sh.mu.Unlock()
		return false, nil
	}
	if f.owner != owner {
		sh.mu.Unlock()
		return false, fmt.Errorf("%w: %s", ErrNotOwner, quote.Q(id))
	}
	live := t.now().Before(f.expires)
	t.endLocked(sh, id, f)
	sh.mu.Unlock()
	if f.spec.id != 0 {
		t.unspeculate(f.spec)
	}
	return live, nil
}

// endLocked removes flight f (request id) from sh. Callers hold sh.mu.
func (t *Tracker) endLocked(sh *flightShard, id string, f flight) {
	delete(sh.m, id)
	t.count.Add(-1)
	f.cell.requests.Add(-1)
	f.cell.tokens.Add(-int64(f.tokens))
}

// Load returns worker (w, gen)'s in-flight requests and prefill tokens;
// expired flights count until the next Sweep. Cost: atomic loads.
func (t *Tracker) Load(w indexer.WorkerID, gen uint32) (requests uint32, tokens uint64) {
	cs := *t.cells.Load()
	if int(w) >= len(cs) {
		return 0, 0
	}
	c := cs[w]
	if c == nil || c.gen != gen {
		return 0, 0
	}
	return uint32(max(c.requests.Load(), 0)), uint64(max(c.tokens.Load(), 0))
}

// Speculative appends to dst, for each worker recently routed a prompt
// sharing a prefix with keys, the length of that prefix in blocks (keys
// are chained, so a binary search finds it). Cost: one read-locked shard
// probe and O(log n) per such worker; no allocation when dst has room.
func (t *Tracker) Speculative(keys []indexer.Key, dst []Spec) []Spec {
	if len(keys) == 0 {
		return dst
	}
	now := t.now()
	ss := t.specShard(keys[0])
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	for _, e := range ss.m[keys[0]] {
		if !now.Before(e.expires) {
			continue
		}
		n := min(len(keys), len(e.keys))
		shared := sort.Search(n, func(i int) bool { return keys[i] != e.keys[i] })
		if shared > 0 {
			dst = append(dst, Spec{Worker: e.w, Gen: e.gen, Blocks: shared})
		}
	}
	return dst
}

// Sweep drops expired flights and speculative entries, a shard at a time.
func (t *Tracker) Sweep() {
	now := t.now()
	for i := range t.flights {
		sh := &t.flights[i]
		sh.mu.Lock()
		for id, f := range sh.m {
			if !now.Before(f.expires) {
				t.endLocked(sh, id, f)
			}
		}
		sh.mu.Unlock()
	}
	var expired []indexer.Key
	for i := range t.spec {
		ss := &t.spec[i]
		expired = expired[:0]
		ss.mu.RLock()
		for k, es := range ss.m {
			for _, e := range es {
				if !now.Before(e.expires) {
					expired = append(expired, k)
					break
				}
			}
		}
		ss.mu.RUnlock()
		if len(expired) == 0 {
			continue
		}
		ss.mu.Lock()
		for _, k := range expired {
			es := ss.m[k]
			keep := es[:0]
			for _, e := range es {
				if now.Before(e.expires) {
					keep = append(keep, e)
				} else {
					t.specKeys.Add(-int64(len(e.keys)))
				}
			}
			clear(es[len(keep):])
			if len(keep) == 0 {
				delete(ss.m, k)
			} else {
				ss.m[k] = keep
			}
		}
		ss.mu.Unlock()
	}
}

// Run sweeps every interval until ctx is done.
func (t *Tracker) Run(ctx context.Context, interval time.Duration) {
	tick.Every(ctx, interval, func(time.Time) { t.Sweep() })
}

// InFlight returns the number of requests in flight.
func (t *Tracker) InFlight() int { return int(t.count.Load()) }

// Refused counts routes refused because the in-flight table was full.
func (t *Tracker) Refused() int64 { return t.refused.Load() }

// SpecSkipped counts routes recorded without their speculative blocks.
func (t *Tracker) SpecSkipped() int64 { return t.skipped.Load() }
