package soak

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Window tracks when the daemon is being restarted: from just before the
// signal until the new process answers and the client has had time to
// reconnect. Calls that overlap a window may fail with the codes a
// restart causes. Its methods may be called from any goroutine.
type Window struct {
	// gen is bumped when a window opens and when it closes (odd while one
	// is open), so that a call that spans one is recognised.
	gen atomic.Uint64
}

// Begin opens the window.
func (w *Window) Begin() { w.gen.Add(1) }

// End closes the window.
func (w *Window) End() { w.gen.Add(1) }

// Mark returns a token for the start of a call.
func (w *Window) Mark() uint64 { return w.gen.Load() }

// Overlaps reports whether a call started at mark overlapped a window.
func (w *Window) Overlaps(mark uint64) bool { return mark%2 == 1 || w.gen.Load() != mark }

// counters are named counts, safe for concurrent use.
type counters struct {
	mu sync.Mutex
	m  map[string]int64
}

// add adds one to name's count and returns the new count.
func (c *counters) add(name string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int64{}
	}
	c.m[name]++
	return c.m[name]
}

func (c *counters) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.m)
}

// Failures collects soak failures, safe for concurrent use: every one is
// counted, the first MaxKept of each kind are kept with their detail.
type Failures struct {
	counts counters
	mu     sync.Mutex
	kept   []string
}

// MaxKept is how many failures of one kind are kept in detail.
const MaxKept = 5

// Add records a failure of kind (a short stable name) with its detail.
func (f *Failures) Add(kind, format string, args ...any) {
	if f.counts.add(kind) <= MaxKept {
		f.mu.Lock()
		f.kept = append(f.kept, kind+": "+fmt.Sprintf(format, args...))
		f.mu.Unlock()
	}
}

// Count returns the number of failures recorded.
func (f *Failures) Count() (n int64) {
	for _, c := range f.Counts() {
		n += c
	}
	return n
}

// Counts returns the failures by kind.
func (f *Failures) Counts() map[string]int64 { return f.counts.snapshot() }

// Kept returns the kept details, in the order recorded.
func (f *Failures) Kept() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.kept)
}

// String lists the failure counts as "kind=n", sorted by kind.
func (f *Failures) String() string {
	counts := f.Counts()
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	return strings.Join(parts, " ")
}
