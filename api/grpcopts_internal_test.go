package api

import (
	"runtime"
	"testing"
)

// TestStreamWorkers checks the stream worker pool's size: 4 per core, and
// never fewer than 8, so that a call waiting for its DATA frame does not
// push the next one onto a goroutine of its own.
func TestStreamWorkers(t *testing.T) {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	if got := streamWorkers(); got != 8 {
		t.Errorf("GOMAXPROCS 1: %d stream workers, want 8", got)
	}
	runtime.GOMAXPROCS(4)
	if got := streamWorkers(); got != 16 {
		t.Errorf("GOMAXPROCS 4: %d stream workers, want 16", got)
	}
}
