package fleetbench

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/proc"
)

// SyncResult is what the sync benchmark measured; its CPU figures are
// until the replica was live.
type SyncResult struct {
	Workers       int   `json:"workers"`
	Keys          int64 `json:"keys"`
	Resident      int64 `json:"resident"`
	SnapshotBytes int64 `json:"snapshot_bytes"`
	// Ready is from the replica process's exec to all its workers live.
	Ready time.Duration `json:"ready_ns"`
	liveReport
	// Floor is restoreFloor on as many goroutines as the replica has
	// cores, in the generator's process once the replica has exited.
	Floor    time.Duration `json:"floor_ns"`
	FloorCPU time.Duration `json:"floor_cpu_ns"`
	Shared
}

// Sync runs the sync benchmark: a generator process (the embedded
// nats-server and one natsbus.Agent per worker, each serving a
// precomputed snapshot of Shape's steady state) and a replica process
// started once every agent is registered.
func Sync(ctx context.Context, o Options) (*SyncResult, error) {
	res := &SyncResult{Workers: o.Workers}
	res.LoadBefore = proc.LoadAvg()[0]
	procs := runtime.NumCPU()
	if o.Pin != (Pinning{}) {
		procs = 0 // each process's GOMAXPROCS is its CPUs
	}
	gen, ready, err := startGen(ctx, "fixed-gen", o.Pin.Generator, genOpts{Options: o, Procs: procs}, 10*time.Minute)
	if err != nil {
		return nil, err
	}
	defer gen.Kill()
	res.Keys, res.Resident, res.SnapshotBytes = ready.Keys, ready.Resident, ready.Bytes
	var c0, c1, fl genDone
	if err := gen.ask("cpu", &c0, time.Minute); err != nil {
		return nil, err
	}
	busy0 := proc.BusyCPU()
	rep, live, at, err := startReplica(ctx, replicaOpts{URL: ready.URL, Workers: o.Workers, Mode: "sync", Profile: o.Profile}, procs, o.Pin.Replica)
	if err != nil {
		return nil, err
	}
	defer rep.Kill()
	busy1 := proc.BusyCPU()
	res.Ready = at.Sub(rep.started)
	res.liveReport, res.ReplicaCPU = *live, live.CPU
	if err := gen.ask("cpu", &c1, time.Minute); err != nil {
		return nil, err
	}
	res.GeneratorCPU = time.Duration(c1.CPUNs - c0.CPUNs)
	res.other(busy0, busy1)
	var dig digestsReport
	if _, err := rep.await("digests", &dig, time.Minute); err != nil {
		return nil, err
	}
	res.DigestsOK = maps.Equal(dig.Digests, ready.Digests)
	if err := rep.finish(30 * time.Second); err != nil {
		return nil, err
	}
	if err := gen.ask("floor", &fl, 5*time.Minute); err != nil {
		return nil, err
	}
	res.Floor, res.FloorCPU = time.Duration(fl.WallNs), time.Duration(fl.CPUNs)
	if err := gen.finish(time.Minute); err != nil {
		return nil, err
	}
	res.LoadAfter = proc.LoadAvg()[0]
	return res, nil
}

// restoreFloor restores every recorded snapshot into keyed workers of a
// fresh index as a replica's sink does, on procs goroutines: what a
// replica's sync costs without NATS.

func restoreFloor(recs []*Recorded, procs int) (*genDone, error) {
	if procs <= 0 {
		procs = runtime.GOMAXPROCS(0)
	}
	runtime.GC()
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel(benchModel, DefaultShape().BlockSize); err != nil {
		return nil, err
	}
	cpu0, t0 := proc.SelfCPU(), time.Now()
	ws := make([]*indexer.Worker, len(recs))
	err := parallel(len(recs), procs, func(seg *indexer.SnapshotSegment, i int) error {
		w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: podName(i)}, Model: benchModel, Keyed: true})
		if err != nil {
			return err
		}
		ws[i] = w
		return recs[i].restore(w, seg)
	})
	fl := &genDone{WallNs: time.Since(t0).Nanoseconds(), CPUNs: (proc.SelfCPU() - cpu0).Nanoseconds()}
	if err != nil {
		return nil, err
	}

	for i, w := range ws {
		if w.Digest() != recs[i].Digest {
			return nil, fmt.Errorf("fleetbench: floor: worker %d's digest differs from its agent's", i)
		}
	}
	return fl, nil
}
