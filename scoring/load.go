package scoring

import (
	"sync"
	"time"

	"github.com/kvindex/kvindex/events"
)

// Scraped is one worker's load read from its engine's metrics endpoint.
type Scraped struct {
	// Running and Waiting are vllm:num_requests_running and _waiting.
	Running, Waiting uint32
	// KVUsage is vllm:kv_cache_usage_perc (0..1).
	KVUsage float64
	// At is when the scrape finished.
	At time.Time
}

// LoadBoard holds the latest scraped load per worker and ignores scrapes
// older than its staleness limit, so a dead metrics endpoint never keeps
// steering traffic with old numbers.
//
// # Concurrency
//
// mu guards m; Get takes it shared.
type LoadBoard struct {
	staleAfter time.Duration

	mu sync.RWMutex
	m  map[events.WorkerRef]Scraped
}

// NewLoadBoard returns an empty board whose entries expire after staleAfter.
func NewLoadBoard(staleAfter time.Duration) *LoadBoard {
	return &LoadBoard{staleAfter: staleAfter, m: make(map[events.WorkerRef]Scraped)}
}

// Set records a scrape.
func (b *LoadBoard) Set(ref events.WorkerRef, s Scraped) {
	b.mu.Lock()
	b.m[ref] = s
	b.mu.Unlock()
}

// Get returns the worker's scrape if it is fresh at now.
func (b *LoadBoard) Get(ref events.WorkerRef, now time.Time) (Scraped, bool) {
	if b == nil {
		return Scraped{}, false
	}
	b.mu.RLock()
	s, ok := b.m[ref]
	b.mu.RUnlock()
	if !ok || now.Sub(s.At) > b.staleAfter {
		return Scraped{}, false
	}
	return s, true
}
