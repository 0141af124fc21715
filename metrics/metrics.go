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

	index  []counter[indexer.Stats]      // per worker, from the index
	stream []counter[events.WorkerStats] // per worker, from the subscriber

	resident, evictions, capacity, digest, lastSeq *prometheus.Desc
	health, backlog, lastMsg, unroutable           *prometheus.Desc
	side, blockSize, bsMismatch                    *prometheus.Desc
	unroutableSrc                                  events.RefusalSource
	digests                                        bool
}

// counter is one per-worker counter read from a stats snapshot S.
type counter[S any] struct {
	desc *prometheus.Desc
	v    func(*S) int64
}

var workerLabels = []string{"pod", "dp_rank", "model"}

// NewCollector returns a collector; stats may be nil.
func NewCollector(ix *indexer.Index, stats events.StatsSource) *Collector {
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc("kvindex_"+name, help, append(append([]string(nil), workerLabels...), extra...), nil)
	}
	type is = indexer.Stats
	type ws = events.WorkerStats
	ic := func(name, help string, v func(*is) int64) counter[is] { return counter[is]{d(name, help), v} }
	sc := func(name, help string, v func(*ws) int64) counter[ws] { return counter[ws]{d(name, help), v} }
	c := &Collector{
		ix:    ix,
		stats: stats,
		index: []counter[is]{
			ic("blocks_stored_total", "Blocks stored (ingested) per worker.", func(s *is) int64 { return s.BlocksStored }),
			ic("blocks_removed_total", "Block removals applied per worker.", func(s *is) int64 { return s.BlocksRemoved }),
			ic("orphan_blocks_total", "Stored blocks whose parent was never announced (cannot match prompts).", func(s *is) int64 { return s.Orphans }),
			ic("unknown_blocks_total", "Removals or offloads naming blocks the worker did not hold.", func(s *is) int64 { return s.UnknownBlocks }),
			ic("block_size_mismatches_total", "Prefix-group stores whose block_size differs from the model's (indexed at their own; see kvindex_block_size_mismatch).", func(s *is) int64 { return s.BlockSizeMismatches }),
			ic("invalid_events_total", "Other events that could not be applied.", func(s *is) int64 { return s.InvalidEvents }),
			ic("skipped_group_events_total", "Events of KV-cache groups of kinds whose hit rule kvindex does not model (counted, not tracked).", func(s *is) int64 { return s.SkippedGroupEvents }),
			ic("unknown_group_blocks_total", "Blocks removed from KV-cache groups the worker never saw stored (nothing touched).", func(s *is) int64 { return s.UnknownGroupBlocks }),
			ic("layout_changes_total", "Stores refused for describing a KV-cache group anew while it held blocks.", func(s *is) int64 { return s.LayoutChanges }),
			ic("side_refused_total", "Blocks of capping KV-cache groups (window, mamba) refused beyond their bound.", func(s *is) int64 { return s.SideRefused }),
			ic("clears_total", "AllBlocksCleared events applied.", func(s *is) int64 { return s.Clears }),
			ic("resets_total", "Forced resets of the worker (engine restarts, unrecoverable gaps).", func(s *is) int64 { return s.Resets }),
		},
		stream: []counter[ws]{
			sc("batches_total", "Event batches (ZMQ messages) decoded per worker.", func(s *ws) int64 { return s.Batches }),
			sc("events_total", "KV events decoded per worker.", func(s *ws) int64 { return s.Events }),
			sc("decode_errors_total", "Messages that could not be decoded and were skipped.", func(s *ws) int64 { return s.DecodeErrors }),
			sc("apply_errors_total", "Batches with at least one event the index could not apply.", func(s *ws) int64 { return s.ApplyErrors }),
			sc("seq_gaps_total", "Forward jumps in seq: lost event batches.", func(s *ws) int64 { return s.Gaps }),
			sc("missed_batches_total", "Batches lost in seq gaps.", func(s *ws) int64 { return s.MissedBatches }),
			sc("engine_restarts_total", "Seqs that went backwards (engine restarts); each reset the worker.", func(s *ws) int64 { return s.Restarts }),
			sc("replays_total", "Replay requests to the engine's replay socket (gaps, late joins, restarts).", func(s *ws) int64 { return s.Replays }),
			sc("replayed_batches_total", "Batches applied from replays.", func(s *ws) int64 { return s.ReplayedBatches }),
			sc("replay_failures_total", "Replays that failed or timed out.", func(s *ws) int64 { return s.ReplayFailures }),
			sc("unrecovered_gaps_total", "Lost batches replay could not fill, each handled by the gap policy.", func(s *ws) int64 { return s.UnrecoveredGaps }),
			sc("stale_replays_total", "Replay answers that arrived after their replay was given up, dropped unapplied.", func(s *ws) int64 { return s.StaleReplays }),
			sc("replay_continuations_total", "Replay answers that arrived in part and were asked for again from the first missing seq.", func(s *ws) int64 { return s.ReplayContinuations }),
			sc("stale_transitions_total", "Times the worker became stale.", func(s *ws) int64 { return s.StaleTransitions }),
			sc("dropped_batches_total", "Messages dropped on a full worker queue.", func(s *ws) int64 { return s.Dropped }),
			sc("unknown_events_total", "KV events of a type kvindex does not know, skipped (the rest of their batches applied).", func(s *ws) int64 { return s.UnknownEvents }),
			sc("unknown_medium_events_total", "Stores and removals naming a medium no table knows, held in scoring.unknown_tier (names: kvindexctl workers).", func(s *ws) int64 { return s.UnknownMediumEvents }),
		},
		lastMsg:    d("last_event_timestamp_seconds", "Unix time of the last message from the worker."),
		resident:   d("resident_blocks", "Blocks the worker currently holds, per medium.", "medium"),
		health:     d("worker_health", "1 for the worker's current health state, by state.", "state"),
		backlog:    d("queue_backlog", "Batches waiting in the worker's queue."),
		evictions:  d("evictions_total", "Blocks evicted by kvindex's bounds, by reason: capacity (after lost removals) or budget.", "reason"),
		capacity:   d("capacity_blocks", "The most blocks the worker may hold (configured or learned); 0 while unbounded."),
		side:       d("side_blocks", "Blocks held by the worker's capping KV-cache groups (sliding-window, mamba, extra full-attention groups of hybrid models)."),
		blockSize:  d("worker_block_size", "The block size the worker's engine announces for its prefix group (0 until a store)."),
		bsMismatch: d("block_size_mismatch", "1 when the worker's announced block size differs from the one its model keys prompts at (the size most of the model's workers announce): no prompt matches its blocks."),
		digest:     d("worker_digest", "The top 53 bits of the worker's resident-set digest (exact in a float): equal on every replica holding the same set (WithDigests only)."),
		lastSeq:    d("worker_last_seq", "The last seq applied to the worker (the engine's, or in fleet mode the agent's delta seq)."),
		unroutable: prometheus.NewDesc("kvindex_push_refused_total", "Push-mode messages (connections, for reason address) a push listener refused, by reason: unknown_topic, pull_worker, other_model, other_listener, max_workers, dp_rank, undecodable, no_worker, address, routed_pod, dp_rank_mismatch.", []string{"listener", "reason"}, nil),
	}
	if u, ok := stats.(events.RefusalSource); ok {
		c.unroutableSrc = u
	}
	return c
}

// WithDigests makes the collector export kvindex_worker_digest, so that
// replicas can be compared (an alert fires when replicas that applied the
// same seq of a worker disagree). Cost, per scrape: Worker.Digest of every
// worker, O(blocks) under each worker's mutex. It returns c.
func (c *Collector) WithDigests() *Collector {
	c.digests = true
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.digest, c.lastSeq, c.lastMsg, c.resident, c.health, c.backlog, c.unroutable, c.evictions, c.capacity, c.side, c.blockSize, c.bsMismatch} {
		ch <- d
	}
	for _, k := range c.index {
		ch <- k.desc
	}
	for _, k := range c.stream {
		ch <- k.desc
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
		for _, k := range c.index {
			ch <- prometheus.MustNewConstMetric(k.desc, prometheus.CounterValue, float64(k.v(&s)), lv...)
		}
		ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(s.Evictions-s.BudgetEvictions), append(lv, "capacity")...)
		ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(s.BudgetEvictions), append(lv, "budget")...)
		ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(s.Capacity), lv...)
		ch <- prometheus.MustNewConstMetric(c.side, prometheus.GaugeValue, float64(s.SideBlocks), lv...)
		ch <- prometheus.MustNewConstMetric(c.blockSize, prometheus.GaugeValue, float64(s.BlockSize), lv...)
		mismatch := 0.0
		if w.BlockSizeMismatch() {
			mismatch = 1
		}
		ch <- prometheus.MustNewConstMetric(c.bsMismatch, prometheus.GaugeValue, mismatch, lv...)
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
		for _, k := range c.stream {
			ch <- prometheus.MustNewConstMetric(k.desc, prometheus.CounterValue, float64(k.v(&s)), lv...)
		}
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
