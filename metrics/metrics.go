// Package metrics exports kvindex's per-worker health as Prometheus metrics.
//
// It reads the index's and the subscriber's counters at scrape time (a
// prometheus.Collector), so ingest pays nothing for metrics and the two
// views can never disagree. Collect is safe for concurrent use.
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

// Collector is a prometheus.Collector over an index and its subscriber.
type Collector struct {
	ix    *indexer.Index
	stats events.StatsSource

	batches, evs, decodeErrs, applyErrs, gaps, missed, restarts, lastMsg *prometheus.Desc
	stored, removed, resident, orphans, unknown, bsMismatch, invalid     *prometheus.Desc
	skippedGroup, clears, resets                                         *prometheus.Desc
	replays, replayed, replayFailures, unrecovered, staleTransitions     *prometheus.Desc
	staleReplays, replayContinuations                                    *prometheus.Desc
	health, dropped, backlog, unroutable                                 *prometheus.Desc
	evictions, capacity                                                  *prometheus.Desc
	digest, lastSeq                                                      *prometheus.Desc
	unroutableSrc                                                        events.RefusalSource
	digests                                                              bool
}

var workerLabels = []string{"pod", "dp_rank", "model"}

// NewCollector returns a collector; stats may be nil.
func NewCollector(ix *indexer.Index, stats events.StatsSource) *Collector {
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc("kvindex_"+name, help, append(append([]string(nil), workerLabels...), extra...), nil)
	}
	c := &Collector{
		ix:           ix,
		stats:        stats,
		batches:      d("batches_total", "Event batches (ZMQ messages) decoded per worker."),
		evs:          d("events_total", "KV events decoded per worker."),
		decodeErrs:   d("decode_errors_total", "Messages that could not be decoded and were skipped."),
		applyErrs:    d("apply_errors_total", "Batches with at least one event the index could not apply."),
		gaps:         d("seq_gaps_total", "Forward jumps in seq: lost event batches."),
		missed:       d("missed_batches_total", "Batches lost in seq gaps."),
		restarts:     d("engine_restarts_total", "Seqs that went backwards (engine restarts); each reset the worker."),
		lastMsg:      d("last_event_timestamp_seconds", "Unix time of the last message from the worker."),
		stored:       d("blocks_stored_total", "Blocks stored (ingested) per worker."),
		removed:      d("blocks_removed_total", "Block removals applied per worker."),
		resident:     d("resident_blocks", "Blocks the worker currently holds, per medium.", "medium"),
		orphans:      d("orphan_blocks_total", "Stored blocks whose parent was never announced (cannot match prompts)."),
		unknown:      d("unknown_blocks_total", "Removals or offloads naming blocks the worker did not hold."),
		bsMismatch:   d("block_size_mismatches_total", "Events whose block_size differs from the model's."),
		invalid:      d("invalid_events_total", "Other events that could not be applied."),
		skippedGroup: d("skipped_group_events_total", "Events of KV-cache groups that do not decide prefix reuse."),
		clears:       d("clears_total", "AllBlocksCleared events applied."),
		resets:       d("resets_total", "Forced resets of the worker (engine restarts, unrecoverable gaps)."),

		replays:             d("replays_total", "Replay requests to the engine's replay socket (gaps, late joins, restarts)."),
		replayed:            d("replayed_batches_total", "Batches applied from replays."),
		replayFailures:      d("replay_failures_total", "Replays that failed or timed out."),
		unrecovered:         d("unrecovered_gaps_total", "Lost batches replay could not fill, each handled by the gap policy."),
		staleReplays:        d("stale_replays_total", "Replay answers that arrived after their replay was given up, dropped unapplied."),
		replayContinuations: d("replay_continuations_total", "Replay answers that arrived in part and were asked for again from the first missing seq."),
		staleTransitions:    d("stale_transitions_total", "Times the worker became stale."),
		health:              d("worker_health", "1 for the worker's current health state, by state.", "state"),
		dropped:             d("dropped_batches_total", "Messages dropped on a full worker queue."),
		backlog:             d("queue_backlog", "Batches waiting in the worker's queue."),
		evictions:           d("evictions_total", "Blocks evicted by kvindex's bounds, by reason: capacity (after lost removals) or budget.", "reason"),
		capacity:            d("capacity_blocks", "The most blocks the worker may hold (configured or learned); 0 while unbounded."),
		digest:              d("worker_digest", "The top 53 bits of the worker's resident-set digest (exact in a float): equal on every replica holding the same set (WithDigests only)."),
		lastSeq:             d("worker_last_seq", "The last seq applied to the worker (the engine's, or in fleet mode the agent's delta seq)."),
		unroutable:          prometheus.NewDesc("kvindex_push_refused_total", "Push-mode messages (connections, for reason address) a push listener refused, by reason: unknown_topic, pull_worker, other_model, other_listener, max_workers, dp_rank, undecodable, no_worker, address, routed_pod.", []string{"listener", "reason"}, nil),
	}
	if u, ok := stats.(events.RefusalSource); ok {
		c.unroutableSrc = u
	}
	return c
}

// WithDigests makes the collector export kvindex_worker_digest, so that
// replicas can be compared (an alert fires when replicas that applied the
// same seq of a worker disagree). Cost, per scrape: Worker.Digest of every
// worker, O(blocks) under each worker's mutex (3.3 ns a block for a
// replica's keyed workers, 20 ns fed engine events: docs/benchmarks.md).
// It returns c.
func (c *Collector) WithDigests() *Collector {
	c.digests = true
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.digest
	ch <- c.lastSeq
	for _, d := range []*prometheus.Desc{c.batches, c.evs, c.decodeErrs, c.applyErrs, c.gaps, c.missed, c.restarts, c.lastMsg,
		c.stored, c.removed, c.resident, c.orphans, c.unknown, c.bsMismatch, c.invalid, c.skippedGroup, c.clears, c.resets,
		c.replays, c.replayed, c.replayFailures, c.unrecovered, c.staleReplays, c.replayContinuations, c.staleTransitions, c.health, c.dropped, c.backlog, c.unroutable, c.evictions, c.capacity} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. Cost: O(workers), no locks held
// across workers.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	models := map[events.WorkerRef]string{}
	for _, w := range c.ix.Workers() {
		info := w.Info()
		models[info.Ref] = info.Model
		lv := []string{info.Ref.Pod, strconv.Itoa(info.Ref.DPRank), info.Model}
		s := w.Stats()
		counter := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
		}
		counter(c.stored, s.BlocksStored)
		counter(c.removed, s.BlocksRemoved)
		counter(c.orphans, s.Orphans)
		counter(c.unknown, s.UnknownBlocks)
		counter(c.bsMismatch, s.BlockSizeMismatches)
		counter(c.invalid, s.InvalidEvents)
		counter(c.skippedGroup, s.SkippedGroupEvents)
		counter(c.clears, s.Clears)
		counter(c.resets, s.Resets)
		ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(s.Evictions-s.BudgetEvictions), append(lv, "capacity")...)
		ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(s.BudgetEvictions), append(lv, "budget")...)
		ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(s.Capacity), lv...)
		if c.digests {
			ch <- prometheus.MustNewConstMetric(c.digest, prometheus.GaugeValue, float64(w.Digest()>>11), lv...)
		}
		for m, n := range s.ResidentByMedium {
			if n == 0 && events.Medium(m) != events.MediumGPU {
				continue
			}
			ch <- prometheus.MustNewConstMetric(c.resident, prometheus.GaugeValue, float64(n), append(lv, events.Medium(m).String())...)
		}
	}
	if c.stats == nil {
		return
	}
	for _, s := range c.stats.WorkerStats() {
		lv := []string{s.Worker.Pod, strconv.Itoa(s.Worker.DPRank), models[s.Worker]}
		counter := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
		}
		counter(c.batches, s.Batches)
		counter(c.evs, s.Events)
		counter(c.decodeErrs, s.DecodeErrors)
		counter(c.applyErrs, s.ApplyErrors)
		counter(c.gaps, s.Gaps)
		counter(c.missed, s.MissedBatches)
		counter(c.restarts, s.Restarts)
		counter(c.replays, s.Replays)
		counter(c.replayed, s.ReplayedBatches)
		counter(c.replayFailures, s.ReplayFailures)
		counter(c.unrecovered, s.UnrecoveredGaps)
		counter(c.staleReplays, s.StaleReplays)
		counter(c.replayContinuations, s.ReplayContinuations)
		counter(c.staleTransitions, s.StaleTransitions)
		counter(c.dropped, s.Dropped)
		ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(s.Backlog), lv...)
		if s.HasSeq {
			ch <- prometheus.MustNewConstMetric(c.lastSeq, prometheus.GaugeValue, float64(s.LastSeq), lv...)
		}
		for h := events.HealthUnknown; int(h) < events.NumHealth; h++ {
			v := 0.0
			if s.Health == h {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.health, prometheus.GaugeValue, v, append(lv, h.String())...)
		}
		if !s.LastMessage.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.lastMsg, prometheus.GaugeValue, float64(s.LastMessage.UnixNano())/1e9, lv...)
		}
	}
	if c.unroutableSrc != nil {
		for _, r := range c.unroutableSrc.Refusals() {
			ch <- prometheus.MustNewConstMetric(c.unroutable, prometheus.CounterValue, float64(r.Count), r.Source, r.Reason)
		}
	}
}
