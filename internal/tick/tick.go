// Package tick runs periodic work: a function every interval until its
// context is done, on one ticker the caller does not have to stop.
package tick

import (
	"context"
	"time"
)

// Every calls f with the tick's time every interval until ctx is done, and
// returns then; f is never called once ctx is done. The first call is one
// interval after Every starts; a call that runs longer than interval delays
// the next (ticks are dropped, not queued). interval must be positive.
func Every(ctx context.Context, interval time.Duration, f func(now time.Time)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if ctx.Err() != nil { // both were ready: select chose at random
				return
			}
			f(now)
		}
	}
}
