package fleetbench

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/embednats"
	"github.com/kvindex/kvindex/testbed/proc"
)

// IngestResult is what the ingest benchmark measured.
type IngestResult struct {
	Workers int `json:"workers"`
	ingestReport
	// PerCore is Blocks per replica CPU-second.
	PerCore float64 `json:"blocks_per_cpu_s"`
	// Baseline is applyBaseline in a row (its caches warm: the faster
	// order, which a backlogged replica approaches), Interleaved in the
	// order the deltas are published in. Ratio is PerCore over Baseline.
	Baseline    float64 `json:"baseline_blocks_per_cpu_s"`
	Interleaved float64 `json:"interleaved_blocks_per_cpu_s"`
	Ratio       float64 `json:"ratio"`
	// Published is the generator's achieved rate, new blocks a second.
	Published     float64 `json:"published_blocks_per_s"`
	SlowConsumers int64   `json:"slow_consumers"`
	Shared
}

// Ingest runs the ingest benchmark: the baseline in this process, then a
// generator process (the embedded nats-server and one natsbus.Agent per
// worker, publishing its recorded deltas at Rate new blocks a second in
// all, whole laps for about Duration) and a replica process.
func Ingest(ctx context.Context, o Options) (*IngestResult, error) {
	res := &IngestResult{Workers: o.Workers}
	res.LoadBefore = proc.LoadAvg()[0]
	recs, err := RecordAll(o.Shape, o.Seed, o.Workers, true)
	if err != nil {
		return nil, err
	}
	var perRound int64
	for _, r := range recs {
		for _, b := range r.Blocks {
			perRound += int64(b)
		}
	}
	rounds := max(1, int(o.Rate*o.Duration.Seconds()/float64(perRound)+0.5))
	if res.Baseline, err = applyBaseline(recs, min(rounds, 2), false); err != nil {
		return nil, err
	}
	if res.Interleaved, err = applyBaseline(recs, min(rounds, 2), true); err != nil {
		return nil, err
	}
	recs = nil
	gen, ready, err := startGen(ctx, "fixed-gen", o.Pin.Generator, genOpts{Options: o, Laps: rounds}, 10*time.Minute)
	if err != nil {
		return nil, err
	}
	defer gen.Kill()
	rep, _, _, err := startReplica(ctx, replicaOpts{URL: ready.URL, Workers: o.Workers, Mode: "ingest", Blocks: ready.Blocks * int64(rounds), Profile: o.Profile}, 1, o.Pin.Replica)
	if err != nil {
		return nil, err
	}
	defer rep.Kill()
	busy0 := proc.BusyCPU()
	if err := gen.send("go"); err != nil {
		return nil, err
	}
	if _, err := rep.await("result", &res.ingestReport, 10*time.Minute); err != nil {
		return nil, err
	}
	busy1 := proc.BusyCPU()
	var done genDone
	if _, err := gen.await("done", &done, time.Minute); err != nil {
		return nil, err
	}
	var dig digestsReport
	if _, err := rep.await("digests", &dig, time.Minute); err != nil {
		return nil, err
	}
	res.DigestsOK = maps.Equal(dig.Digests, ready.Digests)
	res.ReplicaCPU = res.CPU
	if res.ReplicaCPU > 0 {
		res.PerCore = float64(res.Blocks) / res.ReplicaCPU.Seconds()
	}
	if res.Baseline > 0 {
		res.Ratio = res.PerCore / res.Baseline
	}
	res.GeneratorCPU, res.Published, res.SlowConsumers = time.Duration(done.CPUNs), done.rate(), done.Slow
	res.other(busy0, busy1)
	return res, finish(gen, rep, &res.Shared)
}

// applyBaseline applies rounds laps of every recorded worker's deltas to
// keyed workers restored from the recorded snapshots (no NATS), on this
// goroutine with GOMAXPROCS 1, and returns new blocks per CPU-second:
// each worker's lap in a row, or interleaved as the generator publishes
// them (delta i of every worker, then delta i+1).
func applyBaseline(recs []*Recorded, rounds int, interleaved bool) (float64, error) {
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel(benchModel, DefaultShape().BlockSize); err != nil {
		return 0, err
	}
	ws := make([]*indexer.Worker, len(recs))
	for i, rec := range recs {
		w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: podName(i)}, Model: benchModel, Keyed: true})
		if err != nil {
			return 0, err
		}
		if err := rec.restore(w, new(indexer.SnapshotSegment)); err != nil {
			return 0, fmt.Errorf("fleetbench: baseline: %w", err)
		}
		ws[i] = w
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	runtime.GC()
	n, nw := len(recs[0].Deltas), len(recs)
	var blocks int64
	cpu0 := proc.SelfCPU()
	for j := range rounds * n * nw {
		k, i := j/n%nw, j%n // worker k's delta i
		if interleaved {
			k, i = j%nw, j/nw%n
		}
		blocks += int64(recs[k].Blocks[i])
		if err := ws[k].ApplyDelta(&recs[k].Deltas[i]); err != nil {
			return 0, fmt.Errorf("fleetbench: baseline: %w", err)
		}
	}
	cpu := proc.SelfCPU() - cpu0
	for k, rec := range recs {
		if ws[k].Digest() != rec.Digest {
			return 0, fmt.Errorf("fleetbench: baseline: worker %d's digest differs from its source's", k)
		}
	}
	return float64(blocks) / cpu.Seconds(), nil
}

// runFixedGenerator is the generator of ingest and sync: the embedded
// nats-server and an agent per recorded worker (with deltas when Laps is
// set, else snapshots from CacheDir). After "ready" it answers "go"
// (publish Laps laps at Rate, then "done"), "cpu" (its CPU so far) and
// "floor" (restoreFloor) until "exit".
func runFixedGenerator(ctx context.Context, o genOpts, in *Commands, out *Reporter) error {
	load := func() ([]*Recorded, error) { return RecordAll(o.Shape, o.Seed, o.Workers, true) }
	if o.Laps == 0 {
		load = func() ([]*Recorded, error) { return loadRecorded(o.CacheDir, o.Shape, o.Seed, o.Workers) }
	}
	recs, err := load()
	if err != nil {
		return err
	}
	ns, err := embednats.Start("kvfleetbench")
	if err != nil {
		return err
	}
	defer ns.Close()
	fa, err := startAgents(ctx, ns.URL(), recs, o.Shape.BlockSize)
	if err != nil {
		return err
	}
	defer fa.stop()
	r := &genReady{URL: ns.URL(), Digests: map[string]string{}} // as the replica reports them
	for i, rec := range recs {
		r.Digests[podName(i)] = strconv.FormatUint(rec.Digest, 16)
		r.Keys += int64(rec.Keys)
		r.Resident += rec.Resident
		for _, s := range rec.Segments {
			r.Bytes += int64(len(s))
		}
		for _, b := range rec.Blocks {
			r.Blocks += int64(b)
		}
	}
	if err := out.Send("ready", r); err != nil {
		return err
	}
	for {
		cmd, ok := in.Next(ctx)
		if !ok || cmd == "exit" {
			return nil
		}
		var err error
		switch cmd {
		case "go":
			cpu0, t0 := proc.SelfCPU(), time.Now()
			var blocks int64
			if blocks, err = publishLaps(ctx, fa, o.Laps, o.Rate); err == nil {
				err = out.Send("done", genDone{Blocks: blocks, WallNs: time.Since(t0).Nanoseconds(),
					CPUNs: (proc.SelfCPU() - cpu0).Nanoseconds(), Slow: ns.SlowConsumers()})
			}
		case "cpu":
			err = out.Send("cpu", genDone{CPUNs: proc.SelfCPU().Nanoseconds(), Slow: ns.SlowConsumers()})
		case "floor":
			var fl *genDone
			if fl, err = restoreFloor(recs, o.Procs); err == nil {
				err = out.Send("floor", fl)
			}
		}
		if err != nil {
			return err
		}
	}
}

// publishLaps publishes rounds laps of every agent's recorded deltas,
// delta i of every worker in turn, paced open loop at rate new blocks a
// second, and returns the blocks published.

func publishLaps(ctx context.Context, fa *fixedAgents, rounds int, rate float64) (int64, error) {
	n := len(fa.workers[0].rec.Deltas)
	var blocks int64
	t0 := time.Now()
	for range rounds {
		for range n {
			for k, a := range fa.agents {
				fw := fa.workers[k]
				got := 0
				err := a.Publish(0, uint64(fw.pos), float64(time.Now().UnixNano())/1e9, func(_ uint64, d *events.Delta) error {
					got = fw.apply(d)
					return nil
				})
				if err != nil {
					return blocks, fmt.Errorf("fleetbench: publish: %w", err)
				}
				blocks += int64(got)
				if ahead := time.Duration(float64(blocks)/rate*1e9) - time.Since(t0); ahead > time.Millisecond {
					if err := sleep(ctx, ahead); err != nil {
						return blocks, err
					}
				}
			}
		}
	}
	return blocks, nil
}
