package lograte

import (
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	var l Limiter
	t0 := time.Unix(1000, 0)
	if ok, n := l.Allow(t0, time.Minute); !ok || n != 0 {
		t.Fatalf("first report: ok=%v suppressed=%d, want true 0", ok, n)
	}
	for i := 1; i <= 3; i++ {
		if ok, _ := l.Allow(t0.Add(time.Duration(i)*time.Second), time.Minute); ok {
			t.Fatalf("report %d within the interval was let through", i)
		}
	}
	if ok, n := l.Allow(t0.Add(time.Minute), time.Minute); !ok || n != 3 {
		t.Fatalf("report after the interval: ok=%v suppressed=%d, want true 3", ok, n)
	}
	if ok, n := l.Allow(t0.Add(2*time.Minute), time.Minute); !ok || n != 0 {
		t.Fatalf("next interval: ok=%v suppressed=%d, want true 0", ok, n)
	}
}
