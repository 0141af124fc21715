package tick

import (
	"context"
	"testing"
	"time"
)

// TestEvery: f runs on each tick with the tick's time, in order, and Every
// returns once ctx is done.
func TestEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var times []time.Time
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func(now time.Time) {
			times = append(times, now)
			if len(times) == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Every did not return after its context was cancelled")
	}
	if len(times) != 3 {
		t.Fatalf("f ran %d times, want 3 (the third cancels)", len(times))
	}
	for i, now := range times {
		if now.Before(start) || (i > 0 && !now.After(times[i-1])) {
			t.Fatalf("tick times %v: not after the start and increasing", times)
		}
	}
}
