package fleetbench

import (
	"context"
	"fmt"
	"maps"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/fleet"
	"github.com/kvindex/kvindex/testbed/embednats"
	"github.com/kvindex/kvindex/testbed/proc"
)

// LagOptions configure the lag benchmark: Pods engines, each beside its
// agent, churning Rate new blocks a second in all for Duration, and one
// replica.
type LagOptions struct {
	Pods     int
	Shape    Shape
	Seed     uint64
	Rate     float64
	Duration time.Duration
	// WarmRate is the rate of the warm-up lap that brings every worker to
	// its steady state before the replica starts.
	WarmRate float64
	// Profile, when set, is a CPU profile of the replica while the engines
	// churn.
	Profile string
}

// LagResult is what the lag benchmark measured: the time from an engine
// batch (its timestamp, taken when the engine sends it) to the replica
// having applied the delta it became, through the whole agent path:
// enginepub.Publisher, ZeroMQ, fleet.Agent (kvindex agent's code: the
// subscriber, the recording apply, natsbus.Agent.Publish), NATS, and the
// replica's natsbus.Source and index.
type LagResult struct {
	Pods int `json:"pods"`
	// Deltas are the deltas the replica applied while measuring, Blocks
	// their new blocks; Rate the new blocks a second the engines sent.
	Deltas int64   `json:"deltas"`
	Blocks int64   `json:"blocks"`
	Rate   float64 `json:"rate"`
	// The lag distribution, and the fraction of deltas over 5 ms.
	P50  time.Duration `json:"p50_ns"`
	P90  time.Duration `json:"p90_ns"`
	P99  time.Duration `json:"p99_ns"`
	P999 time.Duration `json:"p999_ns"`
	Max  time.Duration `json:"max_ns"`
	Late float64       `json:"late_fraction"`
	// AgentP50 and AgentP99 are the first leg alone, engine to agent (the
	// agents' kvindex_event_lag_seconds over the churn, read off its
	// buckets as Prometheus's histogram_quantile does: to within a
	// bucket), so that the rest is NATS and the replica.
	AgentP50 time.Duration `json:"agent_p50_ns"`
	AgentP99 time.Duration `json:"agent_p99_ns"`
	// Problems counts gaps, drops, decode or apply errors and resyncs in
	// the replica while the engines churned. The CPU figures are over the
	// churn (the generator's: engines, agents and nats-server).
	Problems int64 `json:"problems"`
	Shared
}

// Lag runs the lag benchmark: a generator process (the embedded
// nats-server, the engines and their agents, in process) and a replica
// process.
func Lag(ctx context.Context, o LagOptions) (*LagResult, error) {
	res := &LagResult{Pods: o.Pods}
	res.LoadBefore = proc.LoadAvg()[0]
	w, err := NewWorkload(o.Shape, o.Seed)
	if err != nil {
		return nil, err
	}
	batches := int(o.Rate * o.Duration.Seconds() / blocksPerBatch(w))
	gen, ready, err := startGen(ctx, "lag-gen", genOpts{Workers: o.Pods, Shape: o.Shape, Seed: o.Seed, Rate: o.Rate, Batches: batches, WarmRate: o.WarmRate}, 10*time.Minute)
	if err != nil {
		return nil, err
	}
	defer gen.Kill()
	rep, _, _, err := startReplica(ctx, replicaOpts{URL: ready.URL, Workers: o.Pods, Mode: "lag", Profile: o.Profile}, 0)
	if err != nil {
		return nil, err
	}
	defer rep.Kill()
	busy0 := proc.BusyCPU()
	if err := gen.send("go"); err != nil {
		return nil, err
	}
	var done genDone
	if _, err := gen.await("done", &done, o.Duration+time.Minute); err != nil {
		return nil, err
	}
	var want, got digestsReport
	if _, err := gen.await("digests", &want, time.Minute); err != nil {
		return nil, err
	}
	time.Sleep(500 * time.Millisecond) // the last deltas reach the replica
	if err := rep.send("stop"); err != nil {
		return nil, err
	}
	var r lagReport
	if _, err := rep.await("result", &r, time.Minute); err != nil {
		return nil, err
	}
	busy1 := proc.BusyCPU()
	if _, err := rep.await("digests", &got, time.Minute); err != nil {
		return nil, err
	}
	res.DigestsOK = maps.Equal(got.Digests, want.Digests)
	res.Deltas, res.Blocks, res.Problems, res.Late = int64(r.Deltas), r.Blocks, r.Problems, r.Late
	res.P50, res.P90, res.P99, res.P999, res.Max = time.Duration(r.P50Ns), time.Duration(r.P90Ns), time.Duration(r.P99Ns), time.Duration(r.P999Ns), time.Duration(r.MaxNs)
	res.ReplicaCPU, res.GeneratorCPU = time.Duration(r.CPUNs), time.Duration(done.CPUNs)
	res.AgentP50, res.AgentP99 = time.Duration(done.AgentP50Ns), time.Duration(done.AgentP99Ns)
	res.Rate = done.rate()
	res.other(busy0, busy1)
	return res, finish(gen, rep, &res.Shared)
}

func runLagGenerator(ctx context.Context, o genOpts, in *Commands, out *Reporter) error {
	ns, err := embednats.Start("kvfleetbench")
	if err != nil {
		return err
	}
	defer ns.Close()
	es, err := startEngines(o.Workers, o.Shape, o.Seed)
	if err != nil {
		return err
	}
	defer closeEngines(es)
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	agents := make([]*fleet.Agent, len(es))
	for i, e := range es {
		cfg, err := agentConfig(e, ns.URL())
		if err != nil {
			return err
		}
		nc, err := fleet.Connect(cfg.NATS, "kvfleetbench agent "+e.pod, nil)
		if err != nil {
			return err
		}
		a, err := fleet.NewAgent(actx, cfg, nc, nil)
		if err != nil {
			nc.Close()
			return err
		}
		agents[i] = a
		wg.Add(1)
		go func(nc *nats.Conn) {
			defer wg.Done()
			defer nc.Close()
			_ = a.Run(actx)
		}(nc)
	}
	if err := waitSubscribed(ctx, es, 1); err != nil {
		return err
	}
	// The warm-up lap: every worker reaches its steady state before the
	// replica starts, which then syncs from the agents' snapshots.
	if _, err := playEngines(ctx, es, len(es)*es[0].w.Len(), o.WarmRate); err != nil {
		return err
	}
	if err := caughtUp(ctx, es, agents); err != nil {
		return err
	}
	if err := out.Send("ready", genReady{URL: ns.URL()}); err != nil {
		return err
	}
	if err := in.Wait(ctx, "go"); err != nil {
		return err
	}
	before, err := agentLag(agents)
	if err != nil {
		return err
	}
	cpu0, t0 := proc.SelfCPU(), time.Now()
	blocks, err := playEngines(ctx, es, o.Batches, o.Rate)
	if err != nil {
		return err
	}
	done := genDone{Blocks: blocks, WallNs: time.Since(t0).Nanoseconds(), CPUNs: (proc.SelfCPU() - cpu0).Nanoseconds()}
	if err := caughtUp(ctx, es, agents); err != nil {
		return err
	}
	after, err := agentLag(agents)
	if err != nil {
		return err
	}
	after.sub(before)
	done.AgentP50Ns, done.AgentP99Ns = after.quantile(0.5).Nanoseconds(), after.quantile(0.99).Nanoseconds()
	if err := out.Send("done", done); err != nil {
		return err
	}
	d := digestsReport{Digests: map[string]string{}}
	for i, a := range agents {
		w := a.Index().LookupWorker(events.WorkerRef{Pod: es[i].pod})
		d.Digests[es[i].pod] = strconv.FormatUint(w.Digest(), 16)
	}
	if err := out.Send("digests", d); err != nil {
		return err
	}
	return in.Exit(ctx)
}

// caughtUp waits until every agent has applied its engine's last batch.
func caughtUp(ctx context.Context, es []*engine, agents []*fleet.Agent) error {
	deadline := time.Now().Add(time.Minute)
	for i, e := range es {
		ref := events.WorkerRef{Pod: e.pod}
		for {
			if seq, ok := seqOf(agents[i].Subscriber().WorkerStats(), ref); ok && seq >= e.lastSeq {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("fleetbench: the agent of %s has not caught up with its engine within a minute", e.pod)
			}
			if err := sleep(ctx, 10*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// lagHist is a cumulative histogram: counts[i] observations at most
// bounds[i], the last bound +Inf.
type lagHist struct {
	bounds []float64
	counts []float64
}

// agentLag sums the agents' kvindex_event_lag_seconds{source="zmq"}.
func agentLag(agents []*fleet.Agent) (*lagHist, error) {
	h := &lagHist{}
	for _, a := range agents {
		reg := prometheus.NewRegistry()
		if err := reg.Register(a.LagCollector()); err != nil {
			return nil, fmt.Errorf("fleetbench: agent lag: %w", err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			return nil, fmt.Errorf("fleetbench: agent lag: %w", err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() != "zmq" {
					continue
				}
				bs := m.GetHistogram().GetBucket()
				if h.bounds == nil {
					for _, b := range bs {
						h.bounds = append(h.bounds, b.GetUpperBound())
					}
					h.bounds = append(h.bounds, math.Inf(1))
					h.counts = make([]float64, len(h.bounds))
				}
				for i, b := range bs {
					h.counts[i] += float64(b.GetCumulativeCount())
				}
				h.counts[len(bs)] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return h, nil
}

// sub takes o's counts (an earlier reading) off h's.
func (h *lagHist) sub(o *lagHist) {
	for i := range h.counts {
		if i < len(o.counts) {
			h.counts[i] -= o.counts[i]
		}
	}
}

// quantile interpolates within the bucket holding quantile q, as
// Prometheus's histogram_quantile does (the highest finite bound when it
// falls in +Inf).
func (h *lagHist) quantile(q float64) time.Duration {
	n := len(h.counts)
	if n == 0 || h.counts[n-1] == 0 {
		return 0
	}
	rank := q * h.counts[n-1]
	lo, below := 0.0, 0.0
	for i, c := range h.counts {
		if c >= rank {
			if math.IsInf(h.bounds[i], 1) {
				return time.Duration(h.bounds[i-1] * 1e9)
			}
			f := lo + (h.bounds[i]-lo)*(rank-below)/max(c-below, 1e-9)
			return time.Duration(f * 1e9)
		}
		lo, below = h.bounds[i], c
	}
	return 0
}
