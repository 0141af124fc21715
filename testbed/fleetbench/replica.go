package fleetbench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/natsbus"
	"github.com/kvindex/kvindex/fleet"
	"github.com/kvindex/kvindex/indexer"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
	"github.com/kvindex/kvindex/testbed/loadgen"
	"github.com/kvindex/kvindex/testbed/proc"
)

// replicaOpts configure the replica role: kvindex serve's fleet input as
// the daemon builds it, with a counting worker set between the Source and
// the index (under 1% of a delta's apply). Mode is "ingest" (CPU per
// block until Blocks are applied), "sync" (time to all live, peak RSS),
// "lag" (engine to replica lag until "stop") or "floor" (the lag floor's
// subscriber in the replica's place).
type replicaOpts struct {
	URL     string `json:"url"`
	Workers int    `json:"workers"`
	Mode    string `json:"mode"`
	Blocks  int64  `json:"blocks,omitempty"`
	Profile string `json:"profile,omitempty"`
}

// liveReport is the replica's "live": from the role's start to all
// workers live, its CPU and peak RSS then, the Go heap in use after a GC
// (sync), and the snapshot loads (a retried one counted again) and failed
// ones.
type liveReport struct {
	ReplicaReady   time.Duration `json:"replica_ready_ns"`
	CPU            time.Duration `json:"cpu_ns"`
	PeakRSS        int64         `json:"peak_rss"`
	HeapInuse      int64         `json:"heap_inuse"`
	Replays        int64         `json:"replays"`
	ReplayFailures int64         `json:"replay_failures"`
}

// ingestReport is the replica's "result" in ingest mode: the new blocks
// it applied (each delta also removes about as many, and offloads and
// evicts from CPU a quarter as many), every entry, the deltas, the wall
// time from the first to the last and the CPU over it, and the problems
// (gaps, drops, decode and apply errors, resyncs) after the first sync.
type ingestReport struct {
	Blocks   int64         `json:"blocks"`
	Entries  int64         `json:"entries"`
	Deltas   int64         `json:"deltas"`
	Wall     time.Duration `json:"wall_ns"`
	CPU      time.Duration `json:"cpu_ns"`
	Problems int64         `json:"problems"`
}

// lagReport is the replica's (or the floor subscriber's) "stop": the lag
// of every delta (frame) received while measuring, from its engine
// batch's timestamp; Late is the fraction over 5 ms, Problems as in
// ingestReport (the floor: frames dropped or unreadable).
type lagReport struct {
	Deltas   int64         `json:"deltas"`
	Blocks   int64         `json:"blocks"`
	Wall     time.Duration `json:"wall_ns"`
	CPU      time.Duration `json:"cpu_ns"`
	P50      time.Duration `json:"p50_ns"`
	P90      time.Duration `json:"p90_ns"`
	P99      time.Duration `json:"p99_ns"`
	P999     time.Duration `json:"p999_ns"`
	Max      time.Duration `json:"max_ns"`
	Late     float64       `json:"late_fraction"`
	Problems int64         `json:"problems"`
}

// digestsReport maps each worker's pod to its digest (hex).
type digestsReport struct {
	Digests map[string]string `json:"digests"`
}

func runReplica(ctx context.Context, o replicaOpts, in *Commands, out *Reporter) error {
	if o.Mode == "floor" {
		return runFloorSink(ctx, o.URL, in, out)
	}
	start := time.Now()
	nc, err := fleet.Connect(config.NATS{URL: o.URL}, "kvfleetbench replica", nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	ix := indexer.New(indexer.Config{})
	set := &countingSet{inner: fleet.NewReplicas(ix, nil)}
	var so natsbus.SourceOptions
	var lag lagRecorder
	if o.Mode == "lag" {
		so.Applied = func(_ events.WorkerRef, d natsbus.AppliedDelta) {
			if d.EngineTime != 0 {
				lag.record(d.EngineTime)
			}
		}
	}
	src := natsbus.NewSource(nc, set, so)
	during, after := "", o.Profile // the measured phase: the sync, or what follows
	if o.Mode == "sync" {
		during, after = o.Profile, ""
	}
	stopProfile, err := proc.StartCPUProfile(during)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = src.Run(sctx)
	}()
	defer wg.Wait()
	defer cancel()

	// Pinned to one shared core, a replica syncing 1,000 workers takes
	// over a minute on a 2-core machine.
	if err := waitLive(ctx, src, set, o.Workers, 3*time.Minute); err != nil {
		return err
	}
	live := liveReport{ReplicaReady: time.Since(start), CPU: proc.SelfCPU()}
	stopProfile()
	live.PeakRSS = proc.SelfPeakRSS()
	for _, st := range src.WorkerStats() {
		live.Replays += st.Replays
		live.ReplayFailures += st.ReplayFailures
	}
	if o.Mode == "sync" {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		live.HeapInuse = int64(ms.HeapInuse)
	}
	if err := out.Send("live", live); err != nil {
		return err
	}
	base, _ := problems(src)
	if stopProfile, err = proc.StartCPUProfile(after); err != nil {
		return err
	}
	switch o.Mode {
	case "ingest":
		r, err := measureIngest(ctx, set, o.Blocks, proc.SelfCPU())
		stopProfile()
		if err != nil {
			_, why := problems(src)
			return fmt.Errorf("%w (%s)", err, why)
		}
		n, _ := problems(src)
		r.Problems = n - base
		if err := out.Send("result", r); err != nil {
			return err
		}
	case "lag":
		lag.start(set.blocks.Load())
		err := in.Wait(ctx, "stop")
		stopProfile()
		if err != nil {
			return err
		}
		r := lag.report(set.blocks.Load())
		n, _ := problems(src)
		r.Problems = n - base
		if err := out.Send("stop", r); err != nil {
			return err
		}
	}
	if err := out.Send("digests", digestsOf(ix)); err != nil {
		return err
	}
	if err := in.Exit(ctx); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// waitLive polls until n workers are live. It watches the count of
// restores first: a pass over 1,000 workers' stats every few milliseconds
// would be a fifth of the replica's CPU.
func waitLive(ctx context.Context, src *natsbus.Source, set *countingSet, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		live := 0
		if set.restored.Load() >= int64(n) {
			for _, st := range src.WorkerStats() {
				if st.Health == events.HealthOK {
					live++
				}
			}
			if live >= n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			_, why := problems(src)
			return fmt.Errorf("fleetbench: replica: %d of %d snapshots restored, %d workers live after %v (%s)", set.restored.Load(), n, live, timeout, why)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// problems sums the Source's counters of what should not happen in a
// benchmark, and describes them with the first unhealthy worker's reason.
func problems(src *natsbus.Source) (int64, string) {
	var gaps, dropped, decode, apply, replays, failures int64
	why := ""
	for _, st := range src.WorkerStats() {
		gaps, dropped, decode, apply = gaps+st.Gaps, dropped+st.Dropped, decode+st.DecodeErrors, apply+st.ApplyErrors
		replays, failures = replays+st.Replays, failures+st.ReplayFailures
		if why == "" && st.Health != events.HealthOK {
			why = fmt.Sprintf("; %s: %s", st.Worker, st.HealthReason)
		}
	}
	return gaps + dropped + decode + apply + replays, fmt.Sprintf("NATS reconnects %d, gaps %d, dropped %d, decode errors %d, apply errors %d, snapshot loads %d, failed %d%s",
		src.Reconnects(), gaps, dropped, decode, apply, replays, failures, why)
}

// measureIngest waits until blocks new blocks have been applied.
func measureIngest(ctx context.Context, set *countingSet, blocks int64, cpu0 time.Duration) (*ingestReport, error) {
	b0, e0, d0 := set.blocks.Load(), set.entries.Load(), set.deltas.Load()
	var t0 time.Time
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	idle := time.Now()
	last := b0
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
		b := set.blocks.Load()
		if b != last {
			if t0.IsZero() {
				t0 = time.Now()
			}
			last, idle = b, time.Now()
		}
		if b-b0 >= blocks {
			return &ingestReport{Blocks: b - b0, Entries: set.entries.Load() - e0, Deltas: set.deltas.Load() - d0,
				CPU: proc.SelfCPU() - cpu0, Wall: time.Since(t0)}, nil
		}
		if time.Since(idle) > 30*time.Second {
			return nil, fmt.Errorf("fleetbench: replica: %d of %d blocks applied, none for 30 s", b-b0, blocks)
		}
	}
}

func digestsOf(ix *indexer.Index) digestsReport {
	r := digestsReport{Digests: map[string]string{}}
	for _, w := range ix.Workers() {
		r.Digests[w.Info().Ref.Pod] = strconv.FormatUint(w.Digest(), 16)
	}
	return r
}

// countingSet is the replica's worker set, counting what its sinks do.
type countingSet struct {
	inner                   *fleet.Replicas
	blocks, entries, deltas atomic.Int64
	restored                atomic.Int64 // snapshots restored
}

// AddWorker implements natsbus.WorkerSet.
func (c *countingSet) AddWorker(ref events.WorkerRef, reg *fleetv1.Registration) (natsbus.KeyedSink, error) {
	s, err := c.inner.AddWorker(ref, reg)
	if err != nil {
		return nil, err
	}
	return &countingSink{KeyedSink: s, set: c}, nil
}

// RemoveWorker implements natsbus.WorkerSet.
func (c *countingSet) RemoveWorker(ref events.WorkerRef) { c.inner.RemoveWorker(ref) }

type countingSink struct {
	natsbus.KeyedSink
	set *countingSet
}

// Restore implements natsbus.KeyedSink.
func (s *countingSink) Restore(next func() ([]byte, error)) error {
	err := s.KeyedSink.Restore(next)
	if err == nil {
		s.set.restored.Add(1)
	}
	return err
}

// ApplyDelta implements natsbus.KeyedSink.
func (s *countingSink) ApplyDelta(seq uint64, d *events.Delta) error {
	err := s.KeyedSink.ApplyDelta(seq, d)
	n := 0
	for i := range d.Entries {
		if e := &d.Entries[i]; e.Op == events.DeltaStore && e.BlockEdge {
			n++
		}
	}
	s.set.blocks.Add(int64(n))
	s.set.entries.Add(int64(len(d.Entries)))
	s.set.deltas.Add(1)
	return err
}

// lagRecorder keeps the lag of every delta applied after start, from its
// engine batch's timestamp (engines and replica share the clock).
type lagRecorder struct {
	mu     sync.Mutex // guards everything below
	on     bool
	h      loadgen.Histogram
	over   uint64
	t0     time.Time
	cpu0   time.Duration
	blocks int64
}

func (l *lagRecorder) record(engineTime float64) {
	lag := time.Duration(float64(time.Now().UnixNano()) - engineTime*1e9)
	l.mu.Lock()
	if l.on {
		l.h.Record(lag)
		if lag > 5*time.Millisecond {
			l.over++
		}
	}
	l.mu.Unlock()
}

func (l *lagRecorder) start(blocks int64) {
	l.mu.Lock()
	l.on, l.t0, l.cpu0, l.blocks = true, time.Now(), proc.SelfCPU(), blocks
	l.mu.Unlock()
}

func (l *lagRecorder) report(blocks int64) *lagReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on = false
	r := &lagReport{Deltas: int64(l.h.Count()), Blocks: blocks - l.blocks, Wall: time.Since(l.t0), CPU: proc.SelfCPU() - l.cpu0,
		P50: l.h.Quantile(0.5), P90: l.h.Quantile(0.9), P99: l.h.Quantile(0.99), P999: l.h.Quantile(0.999), Max: l.h.Max()}
	if n := l.h.Count(); n > 0 {
		r.Late = float64(l.over) / float64(n)
	}
	return r
}
