//go:build !linux

package loadgen

import "time"

// sleeper sleeps on Go timers: elsewhere than Linux the pacer is only as
// precise as the runtime's timers (about 1 ms when the process is idle).
type sleeper struct{}

func newSleeper() (*sleeper, error) { return &sleeper{}, nil }

func (*sleeper) sleepUntil(t time.Time) error {
	time.Sleep(time.Until(t))
	return nil
}

func (*sleeper) close() {}
