package fleetbench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/fleet"
	"github.com/kvindex/kvindex/testbed/embednats"
	"github.com/kvindex/kvindex/testbed/proc"
)

// LagFloor is the lag benchmark's floor (forward.go): the same engine
// frames moved ZeroMQ -> NATS -> a subscriber, with nothing applied. Of
// the engine batches sent while measuring, the forwarders published
// FloorForwarded and the subscriber got FloorReceived; FloorProblems are
// the frames lost on the way or unreadable.
type LagFloor struct {
	FloorP50          time.Duration `json:"floor_p50_ns"`
	FloorP99          time.Duration `json:"floor_p99_ns"`
	FloorMax          time.Duration `json:"floor_max_ns"`
	FloorSent         int64         `json:"floor_sent"`
	FloorForwarded    int64         `json:"floor_forwarded"`
	FloorReceived     int64         `json:"floor_received"`
	FloorProblems     int64         `json:"floor_problems"`
	FloorRate         float64       `json:"floor_rate"`
	FloorReplicaCPU   time.Duration `json:"floor_replica_cpu_ns"`
	FloorGeneratorCPU time.Duration `json:"floor_generator_cpu_ns"`
}

// LagResult is what the lag benchmark measured: the time from an engine
// batch (its timestamp, taken when the engine sends it) to the replica
// having applied the delta it became, through the whole agent path:
// enginepub.Publisher, ZeroMQ, fleet.Agent (kvindex agent's code),
// NATS, and the replica's natsbus.Source and index. Its CPU figures are
// over the churn.
type LagResult struct {
	Pods int `json:"pods"`
	lagReport
	// Rate is the new blocks a second the engines sent.
	Rate float64 `json:"rate"`
	// AgentP50 and AgentP99 are the first leg alone, engine to agent (the
	// agents' kvindex_event_lag_seconds, to within a bucket).
	AgentP50 time.Duration `json:"agent_p50_ns"`
	AgentP99 time.Duration `json:"agent_p99_ns"`
	Shared
	LagFloor
	// Ratio is P99 over FloorP99, which are the medians of each round's
	// P99s and FloorP99s (the other figures are the last round's).
	Ratio     float64         `json:"p99_ratio"`
	P99s      []time.Duration `json:"p99s_ns"`
	FloorP99s []time.Duration `json:"floor_p99s_ns"`
	// Offered is the rate asked for (below it, the generator fell behind).
	Offered    float64 `json:"offered_rate"`
	Pinned     Pinning `json:"pinned"`
	AgentProcs int     `json:"agent_procs"`
}

// Lag runs the lag benchmark and its floor, Rounds times each in turn:
// for the path, a generator process (the embedded nats-server, Workers
// engines churning Rate new blocks a second in all for Duration, and
// their agents) and a replica process; for the floor, the same generator
// with forwarders in the agents' place and a subscriber in the replica's.
func Lag(ctx context.Context, o Options) (*LagResult, error) {
	res := &LagResult{Pods: o.Workers, Pinned: o.Pin, Offered: o.Rate, AgentProcs: o.AgentProcs}
	load := proc.LoadAvg()[0]
	w, err := NewWorkload(o.Shape, o.Seed)
	if err != nil {
		return nil, err
	}
	batches := int(o.Rate * o.Duration.Seconds() / blocksPerBatch(w))
	for range max(o.Rounds, 1) {
		fl, err := lagRound(ctx, o, batches, true)
		if err != nil {
			return nil, fmt.Errorf("fleetbench: lag floor: %w", err)
		}
		r, d := &fl.lagReport, &fl.done
		res.LagFloor = LagFloor{FloorP50: r.P50, FloorP99: r.P99, FloorMax: r.Max, FloorSent: d.Batches, FloorForwarded: d.Forwarded,
			FloorReceived: r.Deltas, FloorProblems: r.Problems + d.Batches - d.Forwarded, FloorRate: d.rate(),
			FloorReplicaCPU: r.CPU, FloorGeneratorCPU: time.Duration(d.CPUNs)}
		res.FloorP99s = append(res.FloorP99s, res.FloorP99)
		p, err := lagRound(ctx, o, batches, false)
		if err != nil {
			return nil, err
		}
		res.lagReport, res.Shared, res.Rate = p.lagReport, p.Shared, p.done.rate()
		res.AgentP50, res.AgentP99 = time.Duration(p.done.AgentP50Ns), time.Duration(p.done.AgentP99Ns)
		res.P99s = append(res.P99s, res.P99)
	}
	res.LoadBefore = load
	res.P99, res.FloorP99 = medianDuration(res.P99s), medianDuration(res.FloorP99s)
	if res.FloorP99 > 0 {
		res.Ratio = float64(res.P99) / float64(res.FloorP99)
	}
	return res, nil
}

// medianDuration is the median of ds; 0 for none.
func medianDuration(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// lagRun is one run of the path or the floor.
type lagRun struct {
	lagReport
	done genDone
	Shared
}

// lagRound runs the path, or with floor its floor, once.
func lagRound(ctx context.Context, o Options, batches int, floor bool) (*lagRun, error) {
	run := &lagRun{Shared: Shared{LoadBefore: proc.LoadAvg()[0]}}
	gen, ready, err := startGen(ctx, "lag-gen", o.Pin.Generator, genOpts{Options: o, Batches: batches, Floor: floor}, 10*time.Minute)
	if err != nil {
		return nil, err
	}
	defer gen.Kill()
	mode := map[bool]string{false: "lag", true: "floor"}[floor]
	rep, _, _, err := startReplica(ctx, replicaOpts{URL: ready.URL, Workers: o.Workers, Mode: mode, Profile: o.Profile}, 0, o.Pin.Replica)
	if err != nil {
		return nil, err
	}
	defer rep.Kill()
	busy0 := proc.BusyCPU()
	if err := gen.send("go"); err != nil {
		return nil, err
	}
	if _, err := gen.await("done", &run.done, o.Duration+time.Minute); err != nil {
		return nil, err
	}
	var want, got digestsReport
	if floor {
		// The subscriber has the last frames when its count reaches what
		// was forwarded (or, if some were lost, when it stops growing).
		var c lagReport
		for deadline := time.Now().Add(10 * time.Second); c.Deltas < run.done.Forwarded && time.Now().Before(deadline); {
			if err := rep.ask("count", &c, time.Minute); err != nil {
				return nil, err
			}
			if err := sleep(ctx, 10*time.Millisecond); err != nil {
				return nil, err
			}
		}
	} else {
		if _, err := gen.await("digests", &want, time.Minute); err != nil {
			return nil, err
		}
		time.Sleep(500 * time.Millisecond) // the last deltas reach the replica
	}
	if err := rep.ask("stop", &run.lagReport, time.Minute); err != nil {
		return nil, err
	}
	busy1 := proc.BusyCPU()
	if !floor {
		if _, err := rep.await("digests", &got, time.Minute); err != nil {
			return nil, err
		}
		run.DigestsOK = maps.Equal(got.Digests, want.Digests)
	}
	run.ReplicaCPU, run.GeneratorCPU = run.CPU, time.Duration(run.done.CPUNs)
	run.other(busy0, busy1)
	return run, finish(gen, rep, &run.Shared)
}

// runLagGenerator is the lag-gen role: the embedded nats-server, the
// engines and their agents (or forwarders); it plays a warm-up lap,
// reports "ready", and on "go" plays Batches at Rate, then reports "done"
// (and, for the path, the agents' "digests").
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
	var side lagSide
	if o.AgentProcs > 0 {
		side, err = startProcSide(ctx, ns.URL(), ports(es), o.Floor, o.AgentProcs)
	} else {
		side, err = startLocalSide(ctx, ns.URL(), ports(es), o.Floor)
	}
	if err != nil {
		return err
	}
	defer func() { _ = side.stop() }()
	if err := waitSubscribed(ctx, es, 1); err != nil {
		return err
	}
	var sent int64 // batches played
	play := func(count int, rate float64) (int64, error) {
		blocks, err := playEngines(ctx, es, count, rate)
		sent += int64(count)
		return blocks, err
	}
	caught := func() error { return waitCaughtUp(ctx, side, o.Floor, es, sent) }
	// The floor plays the warm-up lap too, so that its engines send the
	// same frames.
	if _, err := play(len(es)*es[0].w.Len(), o.WarmRate); err != nil {
		return err
	}
	if err := caught(); err != nil {
		return err
	}
	if err := out.Send("ready", genReady{URL: ns.URL()}); err != nil {
		return err
	}
	if err := in.Wait(ctx, "go"); err != nil {
		return err
	}
	before, err := side.agentLag(ctx)
	if err != nil {
		return err
	}
	p0, err := side.progress(ctx)
	if err != nil {
		return err
	}
	cpu0, t0 := proc.SelfCPU()+side.cpu(), time.Now()
	blocks, err := play(o.Batches, o.Rate)
	if err != nil {
		return err
	}
	done := genDone{Blocks: blocks, WallNs: time.Since(t0).Nanoseconds(), CPUNs: (proc.SelfCPU() + side.cpu() - cpu0).Nanoseconds(), Batches: int64(o.Batches)}
	if err := caught(); err != nil {
		return err
	}
	if o.Floor {
		p1, err := side.progress(ctx)
		if err != nil {
			return err
		}
		done.Forwarded = p1.Forwarded - p0.Forwarded
		if err := out.Send("done", done); err != nil {
			return err
		}
		return in.Exit(ctx)
	}
	after, err := side.agentLag(ctx)
	if err != nil {
		return err
	}
	if err := after.add(before, -1); err != nil {
		return err
	}
	done.AgentP50Ns, done.AgentP99Ns = after.quantile(0.5).Nanoseconds(), after.quantile(0.99).Nanoseconds()
	if err := out.Send("done", done); err != nil {
		return err
	}
	d, err := side.digests(ctx)
	if err != nil {
		return err
	}
	if err := out.Send("digests", d); err != nil {
		return err
	}
	return in.Exit(ctx)
}

// lagHist is a cumulative histogram: Counts[i] observations at most
// Bounds[i], and a last count for +Inf.
type lagHist struct {
	Bounds []float64 `json:"bounds"`
	Counts []float64 `json:"counts"`
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
				var o lagHist
				for _, b := range m.GetHistogram().GetBucket() {
					o.Bounds = append(o.Bounds, b.GetUpperBound())
					o.Counts = append(o.Counts, float64(b.GetCumulativeCount()))
				}
				o.Counts = append(o.Counts, float64(m.GetHistogram().GetSampleCount()))
				if err := h.add(&o, 1); err != nil {
					return nil, err
				}
			}
		}
	}
	return h, nil
}

// add adds sign times o's counts to h's (an empty h takes o's bounds).
func (h *lagHist) add(o *lagHist, sign float64) error {
	if len(o.Counts) == 0 {
		return nil
	}
	if h.Counts == nil {
		h.Bounds, h.Counts = o.Bounds, make([]float64, len(o.Counts))
	}
	if len(o.Counts) != len(h.Counts) {
		return fmt.Errorf("fleetbench: agent lag histograms of %d and %d buckets", len(h.Counts), len(o.Counts))
	}
	for i, c := range o.Counts {
		h.Counts[i] += sign * c
	}
	return nil
}

// quantile interpolates within the bucket holding quantile q, as
// Prometheus's histogram_quantile does (the highest finite bound when it
// falls in +Inf).
func (h *lagHist) quantile(q float64) time.Duration {
	n := len(h.Counts)
	if n == 0 || h.Counts[n-1] == 0 {
		return 0
	}
	rank := q * h.Counts[n-1]
	lo, below := 0.0, 0.0
	for i, c := range h.Counts {
		if c >= rank {
			if i == len(h.Bounds) {
				return time.Duration(lo * 1e9)
			}
			return time.Duration((lo + (h.Bounds[i]-lo)*(rank-below)/max(c-below, 1e-9)) * 1e9)
		}
		lo, below = h.Bounds[i], c
	}
	return 0
}

// startLagAgents starts one agent per engine, each on a NATS connection of
// its own; stop ends them (to be called even on an error).

func startLagAgents(ctx context.Context, es []enginePort, natsURL string) ([]*fleet.Agent, func(), error) {
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop := func() {
		cancel()
		wg.Wait()
	}
	agents := make([]*fleet.Agent, len(es))
	for i, e := range es {
		cfg, err := e.agentConfig(natsURL)
		if err != nil {
			return nil, stop, err
		}
		nc, err := fleet.Connect(cfg.NATS, "kvfleetbench agent "+e.Pod, nil)
		if err != nil {
			return nil, stop, err
		}
		a, err := fleet.NewAgent(actx, cfg, nc, nil)
		if err != nil {
			nc.Close()
			return nil, stop, err
		}
		agents[i] = a
		wg.Add(1)
		go func(nc *nats.Conn) {
			defer wg.Done()
			defer nc.Close()
			_ = a.Run(actx)
		}(nc)
	}
	return agents, stop, nil
}
