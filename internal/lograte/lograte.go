// Package lograte rate-limits repeated problem reports by time: the first
// report goes through at once, then at most one per interval, with the
// number held back in between, so a flood of bad input costs one log line
// a minute and nothing is hidden (the count says how much was).
//
// A Limiter is not safe for concurrent use; callers guard it with the lock
// that guards the counters it reports on.
package lograte

import "time"

// Limiter lets the first report through, then one per interval, counting
// what it held back. The zero value is ready to use.
type Limiter struct {
	last       time.Time
	suppressed int
}

// Allow reports whether a report at now may be logged, and if so how many
// were suppressed since the last one that was.
func (l *Limiter) Allow(now time.Time, every time.Duration) (ok bool, suppressed int) {
	if l.last.IsZero() || now.Sub(l.last) >= every {
		n := l.suppressed
		l.last, l.suppressed = now, 0
		return true, n
	}
	l.suppressed++
	return false, 0
}
