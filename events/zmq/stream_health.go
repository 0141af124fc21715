package zmq

import (
	"fmt"
	"time"

	"github.com/kvindex/kvindex/events"
)

// count adds one to the stats counter c, under mu.
func (st *stream) count(c *int64) {
	st.mu.Lock()
	*c++
	st.mu.Unlock()
}

// problem counts and logs (rate-limited) a skipped message or event.
func (st *stream) problem(err error, decode bool) {
	now := time.Now()
	st.mu.Lock()
	if decode {
		st.stats.DecodeErrors++
	} else {
		st.stats.ApplyErrors++
	}
	st.stats.LastError = err.Error()
	emit, suppressed := st.log.Allow(now, st.sub.opts.LogEvery)
	st.mu.Unlock()
	if emit {
		st.sub.opts.Logger.Warn("kv event problem", "worker", st.ref.String(), "err", err, "suppressed", suppressed)
	}
}

// evalHealth recomputes the stream's health at now and returns it.
func (st *stream) evalHealth(now time.Time, o *SubscriberOptions) events.Health {
	stale := false
	if st.monitored && !st.connected.Load() && o.StaleAfterDisconnect > 0 {
		if since := st.disconnected.Load(); since != 0 && now.Sub(time.Unix(0, since)) >= o.StaleAfterDisconnect {
			stale = true
		}
	}
	last := st.lastMessage.Load()
	if o.StaleAfterSilence > 0 && last != 0 && now.Sub(time.Unix(0, last)) >= o.StaleAfterSilence {
		stale = true
	}
	switch {
	case stale:
		return events.HealthStale
	case st.inConflict.Load():
		return events.HealthConflict
	case st.isRecovering.Load():
		return events.HealthRecovering
	case st.unsynced.Load():
		return events.HealthUnsynced
	case st.lastBad.Load() != 0 && now.Sub(time.Unix(0, st.lastBad.Load())) < degradedFor:
		return events.HealthDegraded
	case last != 0 || (st.monitored && st.connected.Load()):
		return events.HealthOK
	}
	return events.HealthUnknown
}

// refreshHealth re-evaluates health now.
func (st *stream) refreshHealth() {
	now := time.Now()
	st.setHealth(st.evalHealth(now, &st.sub.opts), now)
}

// setHealth stores h, counting and logging STALE transitions; mu orders callers.
func (st *stream) setHealth(h events.Health, now time.Time) {
	st.mu.Lock()
	old := st.stats.Health
	if old == h {
		st.mu.Unlock()
		return
	}
	st.stats.Health = h
	st.health.Store(h)
	if h == events.HealthStale {
		st.stats.StaleSince = now
		st.stats.StaleTransitions++
	} else if old == events.HealthStale {
		st.stats.StaleSince = time.Time{}
	}
	st.mu.Unlock()
	if h == events.HealthStale {
		st.sub.opts.Logger.Warn("worker stale: left out of Score answers", "worker", st.ref.String())
	} else if old == events.HealthStale {
		st.sub.opts.Logger.Info("worker back from stale", "worker", st.ref.String(), "health", h.String())
	}
}

// snapshot returns the stream's stats.
func (st *stream) snapshot() events.WorkerStats {
	st.mu.Lock()
	s := st.stats
	st.mu.Unlock()
	s.Backlog = len(st.in)
	s.Connected = st.connected.Load()
	s.HealthReason = st.healthReason(&s, time.Now())
	return s
}

// healthReason says, for an operator, why s.Health is not OK.
func (st *stream) healthReason(s *events.WorkerStats, now time.Time) string {
	switch s.Health {
	case events.HealthStale:
		if st.monitored && !s.Connected {
			return "no connection to the engine's event socket since " + s.StaleSince.UTC().Format(time.RFC3339)
		}
		return "no message since " + s.LastMessage.UTC().Format(time.RFC3339)
	case events.HealthConflict:
		return s.ConflictReason
	case events.HealthRecovering:
		return "a replay is filling lost events"
	case events.HealthUnsynced:
		return "events were lost beyond replay and kept (gap_policy keep): " + s.UnsyncedReason
	case events.HealthDegraded:
		return fmt.Sprintf("events failed to decode or apply within the last %v; last: %s", degradedFor, s.LastError)
	}
	return ""
}

// degradedFor is how long a bad event keeps the worker DEGRADED.
const degradedFor = time.Minute
