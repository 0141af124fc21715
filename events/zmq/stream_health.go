package zmq

import (
	"fmt"
	"slices"
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

// unknowns counts and logs (rate-limited, by type and by name) what batch
// seq held that kvindex does not know: b.UnknownEvents skipped events, and
// media stores and removals naming the medium name, none in any table.
// Neither makes the worker DEGRADED: the rest of the batch is applied, and
// the blocks are held in the Tiers' unknown class.
func (st *stream) unknowns(seq uint64, b *events.Batch, media int, name string) {
	now := time.Now()
	st.mu.Lock()
	s := &st.stats
	var typeEmit, mediumEmit bool
	var typeHeld, mediumHeld int
	if b.UnknownEvents > 0 {
		s.UnknownEvents += int64(b.UnknownEvents)
		s.UnknownTag = b.UnknownTag
		typeEmit, typeHeld = st.typeLog.Allow(now, st.sub.opts.LogEvery)
	}
	if media > 0 {
		s.UnknownMediumEvents += int64(media)
		if len(s.UnknownMedia) < events.MaxUnknownMedia && !slices.Contains(s.UnknownMedia, name) {
			s.UnknownMedia = append(s.UnknownMedia, name)
		}
		mediumEmit, mediumHeld = st.mediumLog.Allow(now, st.sub.opts.LogEvery)
	}
	st.mu.Unlock()
	log := st.sub.opts.Logger
	if typeEmit {
		log.Warn("kv events of an unknown type skipped; the rest of the batch applied", "worker", st.ref.String(),
			"seq", seq, "type", b.UnknownTag, "events", b.UnknownEvents, "suppressed", typeHeld)
	}
	if mediumEmit {
		log.Warn("kv events name a medium kvindex does not know; map it with scoring.tier_names", "worker", st.ref.String(),
			"seq", seq, "medium", name, "held_as", st.sub.opts.Tiers.Unknown().String(), "events", media, "suppressed", mediumHeld)
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
	s.UnknownMedia = slices.Clone(s.UnknownMedia)
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
