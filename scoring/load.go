package scoring

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/events"
)

// Scraped is one worker's load read from its engine's metrics endpoint.
type Scraped struct {
	// Running and Waiting are vllm:num_requests_running and _waiting.
	Running, Waiting uint32
	KVUsage          float64   // vllm:kv_cache_usage_perc (0..1).
	At               time.Time // when the scrape finished.
}

// LoadBoard holds the latest scraped load per worker, ignoring scrapes
// older than its staleness limit. Safe for concurrent use: mu guards
// finding or creating a cell, whose value is read and written atomically
// (one atomic load on the Score path, which caches the cells).
type LoadBoard struct {
	staleAfter time.Duration

	mu    sync.Mutex
	cells map[events.WorkerRef]*LoadCell
}

// LoadCell is one worker's latest scrape on a LoadBoard.
type LoadCell struct {
	staleAfter time.Duration
	v          atomic.Pointer[Scraped]
}

// NewLoadBoard returns an empty board whose entries expire after staleAfter.
func NewLoadBoard(staleAfter time.Duration) *LoadBoard {
	return &LoadBoard{staleAfter: staleAfter, cells: make(map[events.WorkerRef]*LoadCell)}
}

// Cell returns the worker's cell, creating an empty one the first time;
// a nil board returns nil cells, which read as no load.
func (b *LoadBoard) Cell(ref events.WorkerRef) *LoadCell {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.cells[ref]
	if c == nil {
		c = &LoadCell{staleAfter: b.staleAfter}
		b.cells[ref] = c
	}
	return c
}

// Set records a scrape.
func (b *LoadBoard) Set(ref events.WorkerRef, s Scraped) {
	b.Cell(ref).v.Store(&s)
}

// Load returns the cell's scrape if it is fresh at now; no lock.
func (c *LoadCell) Load(now time.Time) (Scraped, bool) {
	if c == nil {
		return Scraped{}, false
	}
	s := c.v.Load()
	if s == nil || now.Sub(s.At) > c.staleAfter {
		return Scraped{}, false
	}
	return *s, true
}
