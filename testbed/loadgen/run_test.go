package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestPacerSchedule(t *testing.T) {
	start := time.Unix(1000, 0)
	p := newPacer(start, 10000, 2*time.Second)
	if p.total != 20000 {
		t.Fatalf("total = %d, want 20000", p.total)
	}
	if p.interval != 100*time.Microsecond {
		t.Fatalf("interval = %v, want 100µs", p.interval)
	}
	if got := p.due(0); !got.Equal(start) {
		t.Errorf("due(0) = %v", got)
	}
	if got := p.due(19999); !got.Equal(start.Add(1999900 * time.Microsecond)) {
		t.Errorf("due(19999) = %v, want start+1.9999s", got)
	}
	if p := newPacer(start, 3, time.Second); p.total != 3 || p.interval != 333333333 {
		t.Errorf("3/s: %+v", p)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{Rate: 0, Duration: time.Second, Concurrency: 1},
		{Rate: 10, Duration: 0, Concurrency: 1},
		{Rate: 10, Duration: time.Second, Concurrency: 0},
		{Rate: 10, Duration: time.Second, Concurrency: 1, Timeout: -1},
	} {
		if _, err := Run(context.Background(), c, nil); err == nil {
			t.Errorf("Run(%+v) accepted", c)
		}
	}
}

func TestRunSendsEveryScheduledRequestOnce(t *testing.T) {
	const c = 4
	var mu sync.Mutex
	seen := map[int64]int{}
	do := func(_ context.Context, g int, k int64) error {
		mu.Lock()
		defer mu.Unlock()
		if g < 0 || g >= c {
			t.Errorf("request %d sent by sender %d of %d", k, g, c)
		}
		seen[k]++
		if k == 7 {
			return errors.New("boom")
		}
		return nil
	}
	start := time.Now()
	r, err := Run(context.Background(), Config{Rate: 1000, Duration: 300 * time.Millisecond, Concurrency: c}, do)
	if err != nil {
		t.Fatal(err)
	}
	if r.Scheduled != 300 || r.Sent != 300 || len(seen) != 300 {
		t.Fatalf("scheduled %d sent %d distinct %d, want 300", r.Scheduled, r.Sent, len(seen))
	}
	for k, n := range seen {
		if n != 1 || k < 0 || k >= 300 {
			t.Fatalf("request %d sent %d times", k, n)
		}
	}
	if r.Errors != 1 || r.FirstError != "boom" {
		t.Errorf("errors %d %q, want 1 boom", r.Errors, r.FirstError)
	}
	// Open loop: the run takes the schedule's time, not less.
	if el := time.Since(start); el < 290*time.Millisecond {
		t.Errorf("run took %v, want at least the 300ms schedule", el)
	}
	if r.Latency.Count() != 300 || r.Lag.Count() != 300 {
		t.Errorf("histograms hold %d and %d values", r.Latency.Count(), r.Lag.Count())
	}
}

// TestRunCountsStallsAgainstDelayedRequests is the coordinated-omission
// check: one 50 ms stall with a single sender at 1000 req/s delays the ~50
// requests due during it, and each of them must show that delay.
func TestRunCountsStallsAgainstDelayedRequests(t *testing.T) {
	do := func(_ context.Context, _ int, k int64) error {
		if k == 100 {
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	}
	r, err := Run(context.Background(), Config{Rate: 1000, Duration: 400 * time.Millisecond, Concurrency: 1}, do)
	if err != nil {
		t.Fatal(err)
	}
	// A closed-loop client would report one slow request (p99 ~ fast); the
	// open loop charges the stall to the requests queued behind it.
	slow := 0
	for i, c := range r.Latency.counts {
		if bucketMax(i) >= uint64(20*time.Millisecond) {
			slow += int(c)
		}
	}
	if slow < 25 {
		t.Errorf("%d requests slower than 20ms, want the ~30 queued behind the stall", slow)
	}
	if p99 := r.Latency.Quantile(0.99); p99 < 20*time.Millisecond {
		t.Errorf("p99 = %v, want the stall to show (>= 20ms)", p99)
	}
	if r.Lag.Max() < 20*time.Millisecond {
		t.Errorf("lag max %v: the delayed sends should show as generator lag", r.Lag.Max())
	}
}

func TestRunStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	r, err := Run(ctx, Config{Rate: 100, Duration: time.Hour, Concurrency: 2},
		func(context.Context, int, int64) error { return nil })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "stopped after") {
		t.Fatalf("err = %v, want a wrapped deadline", err)
	}
	if r == nil || r.Sent == 0 || r.Sent > 20 {
		t.Fatalf("result %+v, want the ~10 requests sent before the deadline", r)
	}
}

func TestRunTimeout(t *testing.T) {
	do := func(ctx context.Context, _ int, _ int64) error {
		<-ctx.Done()
		return ctx.Err()
	}
	r, err := Run(context.Background(), Config{Rate: 100, Duration: 50 * time.Millisecond, Concurrency: 5, Timeout: 5 * time.Millisecond}, do)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != r.Sent || r.Sent != 5 {
		t.Errorf("sent %d errors %d, want 5 timeouts", r.Sent, r.Errors)
	}
}

// TestRunCountsRefusalsApart: ResourceExhausted answers (wrapped, as
// ScoreDo returns them) are refusals, not errors, and the accepted and
// refused latencies are kept apart.
func TestRunCountsRefusalsApart(t *testing.T) {
	do := func(_ context.Context, _ int, k int64) error {
		switch k % 4 {
		case 0:
			return fmt.Errorf("loadgen: Score of prompt 0: %w", status.Error(codes.ResourceExhausted, "overloaded"))
		case 1:
			time.Sleep(2 * time.Millisecond)
			return nil
		case 2:
			return status.Error(codes.Internal, "boom")
		}
		return nil
	}
	r, err := Run(context.Background(), Config{Rate: 2000, Duration: 200 * time.Millisecond, Concurrency: 8}, do)
	if err != nil {
		t.Fatal(err)
	}
	if r.Sent != 400 || r.Refused != 100 || r.Errors != 100 || r.Accepted.Count() != 200 || r.Rejected.Count() != 100 {
		t.Fatalf("sent %d refused %d errors %d accepted %d rejected %d, want 400 100 100 200 100", r.Sent, r.Refused, r.Errors, r.Accepted.Count(), r.Rejected.Count())
	}
	if r.Accepted.Max() < 2*time.Millisecond {
		t.Fatalf("accepted max %v, want the 2 ms calls in it", r.Accepted.Max())
	}
	rep := NewReport("x", false, DefaultShape(), false, Config{Rate: 2000, Duration: 200 * time.Millisecond, Concurrency: 8}, r)
	if rep.Refused != 100 || rep.Errors != 100 || rep.RefusedP99 <= 0 || rep.AcceptedP99 <= 0 {
		t.Fatalf("report: %+v", rep)
	}
}
