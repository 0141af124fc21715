//go:build !linux

package loadgen

import "time"

// sleeper sleeps on Go timers: elsewhere than Linux the pacer is only as
// precise as the runtime's timers (about 1 ms when the process is idle).
type sleeper struct {
	next     time.Time // next expiration of every's schedule
	interval time.Duration
}

func newSleeper() (*sleeper, error) { return &sleeper{}, nil }

func (s *sleeper) every(first, interval time.Duration) error {
	s.next, s.interval = time.Now().Add(first), interval
	return nil
}

func (s *sleeper) ticks() (uint64, error) {
	time.Sleep(time.Until(s.next))
	n := uint64(time.Since(s.next)/s.interval) + 1
	s.next = s.next.Add(time.Duration(n) * s.interval)
	return n, nil
}

func (*sleeper) sleepUntil(t time.Time) error {
	time.Sleep(time.Until(t))
	return nil
}

func (*sleeper) close() {}
