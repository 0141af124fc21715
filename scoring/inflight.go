package scoring

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/kvindex/kvindex/indexer"
)

// ErrDuplicateRequest: Route was given a request id already in flight.
var ErrDuplicateRequest = errors.New("scoring: request id already in flight")

// Tracker remembers routing decisions (Route): each request's uncached
// prefill tokens count as its worker's in-flight load until Release or
// FlightTTL, and its blocks count as speculatively cached on that worker
// for SpecTTL, because BlockStored events arrive only once the engine
// schedules the prefill; without this, a burst of requests sharing a new
// prefix would scatter before the first event arrives.
//
// # Concurrency
//
// mu guards everything; reads (Load, Speculative) take it shared, Record,
// Release and Sweep exclusively. It is never held while calling out.
type Tracker struct {
	specTTL, flightTTL time.Duration
	now                func() time.Time

	mu      sync.RWMutex
	flights map[string]*flight
	workers []workerFlights // by WorkerID
	// spec maps a prompt's first block key to, per worker, the longest
	// recent prompt routed there, so a lookup is one map probe plus a
	// binary search per worker.
	spec map[indexer.Key]map[indexer.WorkerID]*specEntry
}

type flight struct {
	worker  indexer.WorkerID
	tokens  uint64
	expires time.Time
}

type workerFlights struct {
	requests uint32
	tokens   uint64
}

type specEntry struct {
	keys    []indexer.Key
	expires time.Time
}

// NewTracker returns a tracker; zero TTLs mean 10 s (speculative blocks)
// and 2 min (in-flight load). now may be nil (time.Now).
func NewTracker(specTTL, flightTTL time.Duration, now func() time.Time) *Tracker {
	if specTTL <= 0 {
		specTTL = 10 * time.Second
	}
	if flightTTL <= 0 {
		flightTTL = 2 * time.Minute
	}
	if now == nil {
		now = time.Now
	}
	return &Tracker{
		specTTL: specTTL, flightTTL: flightTTL, now: now,
		flights: make(map[string]*flight),
		spec:    make(map[indexer.Key]map[indexer.WorkerID]*specEntry),
	}
}

// Record notes that request id was sent to worker w with the prompt's block
// keys and tokens uncached prefill tokens. keys is copied.
func (t *Tracker) Record(id string, w indexer.WorkerID, keys []indexer.Key, tokens uint64) error {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if f, ok := t.flights[id]; ok && now.Before(f.expires) {
		return fmt.Errorf("%w: %q", ErrDuplicateRequest, id)
	} else if ok {
		t.endLocked(id, f)
	}
	for int(w) >= len(t.workers) {
		t.workers = append(t.workers, workerFlights{})
	}
	t.flights[id] = &flight{worker: w, tokens: tokens, expires: now.Add(t.flightTTL)}
	t.workers[w].requests++
	t.workers[w].tokens += tokens
	if len(keys) > 0 {
		byWorker := t.spec[keys[0]]
		if byWorker == nil {
			byWorker = make(map[indexer.WorkerID]*specEntry)
			t.spec[keys[0]] = byWorker
		}
		e := byWorker[w]
		if e == nil || !now.Before(e.expires) || len(keys) >= len(e.keys) {
			byWorker[w] = &specEntry{keys: append([]indexer.Key(nil), keys...), expires: now.Add(t.specTTL)}
		} else {
			e.expires = now.Add(t.specTTL)
		}
	}
	return nil
}

// Release ends request id's in-flight accounting; false if unknown or expired.
func (t *Tracker) Release(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	f, ok := t.flights[id]
	if !ok {
		return false
	}
	live := t.now().Before(f.expires)
	t.endLocked(id, f)
	return live
}

func (t *Tracker) endLocked(id string, f *flight) {
	delete(t.flights, id)
	wf := &t.workers[f.worker]
	wf.requests--
	wf.tokens -= f.tokens
}

// Load returns worker w's in-flight requests and prefill tokens. Expired
// flights still count until the next Sweep (at most one sweep interval).
func (t *Tracker) Load(w indexer.WorkerID) (requests uint32, tokens uint64) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if int(w) < len(t.workers) {
		return t.workers[w].requests, t.workers[w].tokens
	}
	return 0, 0
}

// Speculative calls visit for each worker recently routed a prompt that
// shares a prefix with keys, with the length of that shared prefix in
// blocks. Content keys are chained, so equal keys at position i mean equal
// prefixes through i, and the shared length is found by binary search.
// visit runs under the read lock and must not call the tracker.
// Cost: one map probe and O(log n) per such worker.
func (t *Tracker) Speculative(keys []indexer.Key, visit func(w indexer.WorkerID, blocks int)) {
	if len(keys) == 0 {
		return
	}
	now := t.now()
	t.mu.RLock()
	defer t.mu.RUnlock()
	for w, e := range t.spec[keys[0]] {
		if !now.Before(e.expires) {
			continue
		}
		n := min(len(keys), len(e.keys))
		shared := sort.Search(n, func(i int) bool { return keys[i] != e.keys[i] })
		if shared > 0 {
			visit(w, shared)
		}
	}
}

// Sweep drops expired flights and speculative entries.
func (t *Tracker) Sweep() {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, f := range t.flights {
		if !now.Before(f.expires) {
			t.endLocked(id, f)
		}
	}
	for k, byWorker := range t.spec {
		for w, e := range byWorker {
			if !now.Before(e.expires) {
				delete(byWorker, w)
			}
		}
		if len(byWorker) == 0 {
			delete(t.spec, k)
		}
	}
}

// Run sweeps every interval until ctx is done.
func (t *Tracker) Run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.Sweep()
		}
	}
}

// InFlight returns the number of requests in flight, for metrics.
func (t *Tracker) InFlight() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.flights)
}
