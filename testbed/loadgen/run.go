package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Config is the load: Rate requests per second, spread evenly over
// Duration (open loop), from Concurrency sender goroutines (at most that
// many requests in flight), each bounded by Timeout (0: none beyond ctx).
type Config struct {
	Rate        float64
	Duration    time.Duration
	Concurrency int
	Timeout     time.Duration
}

func (c Config) validate() error {
	switch {
	case !(c.Rate > 0) || c.Rate > 1e7:
		return fmt.Errorf("loadgen: rate %v requests/s must be in (0, 1e7]", c.Rate)
	case c.Duration <= 0:
		return fmt.Errorf("loadgen: duration %v must be positive", c.Duration)
	case c.Concurrency <= 0:
		return fmt.Errorf("loadgen: concurrency %d must be positive", c.Concurrency)
	case c.Timeout < 0:
		return fmt.Errorf("loadgen: timeout %v must not be negative", c.Timeout)
	}
	return nil
}

// pacer is the open-loop schedule: request k is due at start + k*interval.
type pacer struct {
	start    time.Time
	interval time.Duration
	total    int64 // requests in the schedule
}

func newPacer(start time.Time, rate float64, d time.Duration) pacer {
	interval := time.Duration(float64(time.Second) / rate)
	total := int64(d.Seconds() * rate)
	return pacer{start: start, interval: max(interval, 1), total: total}
}

// due returns when request k is due.
func (p pacer) due(k int64) time.Time { return p.start.Add(time.Duration(k) * p.interval) }

// Do sends one request. sender is the sending goroutine's index in
// [0, Concurrency) (to pick its connection) and k the request's index in
// the schedule (to pick its prompt). It must be safe for concurrent use by
// distinct senders.
type Do func(ctx context.Context, sender int, k int64) error

// Result is what a Run measured: the requests in the schedule
// (Rate*Duration) and those sent before ctx ended; the failed ones other
// than Refused (ResourceExhausted: admission control's answer by design),
// with the first one's text; and the time from the first due time to the
// last reply. Latency is from each request's due time to its reply,
// errors included; Accepted is that of the requests answered OK, Rejected
// of the refused ones. Lag is how late each request left a sender after
// its due time (already part of Latency): a large lag with idle senders
// means the generator, not the server, limited the run.
type Result struct {
	Scheduled, Sent    int64
	Errors             int64
	FirstError         string
	Refused            int64
	Elapsed            time.Duration
	Latency            Histogram
	Accepted, Rejected Histogram
	Lag                Histogram
}

// Achieved returns the rate requests were completed at.
func (r *Result) Achieved() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Sent) / r.Elapsed.Seconds()
}

// Run sends the requests of cfg's schedule through do and measures them
// (see the package doc). It returns when every scheduled request has been
// answered or ctx is done (then with the requests measured so far and
// ctx's error).
func Run(ctx context.Context, cfg Config, do Do) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sl, err := newSleeper()
	if err != nil {
		return nil, err
	}
	defer sl.close()
	p := newPacer(time.Now().Add(10*time.Millisecond), cfg.Rate, cfg.Duration)
	queue := make(chan int64, min(p.total, 1<<16))
	parts := make([]*Result, cfg.Concurrency)
	var wg sync.WaitGroup
	for g := range cfg.Concurrency {
		parts[g] = new(Result)
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(ctx, cfg.Timeout, p, g, queue, do, parts[g])
		}()
	}
	paceErr := pace(ctx, p, sl, queue)
	wg.Wait()
	end := time.Now()
	r := &Result{Scheduled: p.total, Elapsed: end.Sub(p.start)}
	for _, part := range parts {
		r.Sent += part.Sent
		r.Errors += part.Errors
		r.Refused += part.Refused
		r.Accepted.Merge(&part.Accepted)
		r.Rejected.Merge(&part.Rejected)
		if r.FirstError == "" {
			r.FirstError = part.FirstError
		}
		r.Latency.Merge(&part.Latency)
		r.Lag.Merge(&part.Lag)
	}
	if err := cmp.Or(ctx.Err(), paceErr); err != nil {
		return r, fmt.Errorf("loadgen: run stopped after %d of %d requests: %w", r.Sent, r.Scheduled, err)
	}
	return r, nil
}

// pace puts each request of p into queue at its due time, then closes
// queue. Each wake-up of a periodic timer releases every request that has
// come due (usually one).
func pace(ctx context.Context, p pacer, sl *sleeper, queue chan<- int64) error {
	defer close(queue)
	if err := sl.every(time.Until(p.start), p.interval); err != nil {
		return err
	}
	for k := int64(0); k < p.total; {
		n, err := sl.ticks()
		if err != nil {
			return err
		}
		for ; n > 0 && k < p.total; n-- {
			if ctx.Err() != nil {
				return nil
			}
			// The timer was armed after its start time was computed, so it
			// expires no earlier than the schedule; this guards the rest.
			if err := sl.sleepUntil(p.due(k)); err != nil {
				return err
			}
			select {
			case queue <- k:
			case <-ctx.Done():
				return nil
			}
			k++
		}
	}
	return nil
}

// send is sender g's loop: take due requests from queue until it closes.
func send(ctx context.Context, timeout time.Duration, p pacer, g int, queue <-chan int64, do Do, r *Result) {
	for k := range queue {
		if ctx.Err() != nil {
			continue // drain without sending
		}
		due := p.due(k)
		r.Lag.Record(time.Since(due))
		err := call(ctx, timeout, do, g, k)
		lat := time.Since(due)
		r.Latency.Record(lat)
		r.Sent++
		switch {
		case err == nil:
			r.Accepted.Record(lat)
		case status.Code(err) == codes.ResourceExhausted:
			r.Refused++
			r.Rejected.Record(lat)
		case !(errors.Is(err, context.Canceled) && ctx.Err() != nil):
			r.Errors++
			if r.FirstError == "" {
				r.FirstError = err.Error()
			}
		}
	}
}

// call runs do within timeout (0: none).
func call(ctx context.Context, timeout time.Duration, do Do, g int, k int64) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return do(ctx, g, k)
}
