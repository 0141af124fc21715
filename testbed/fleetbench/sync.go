package fleetbench

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"sync"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/proc"
)

// SyncResult is what the sync benchmark measured. Its CPU figures are
// until the replica was live (the generator's: its agents serving
// snapshots, and the embedded nats-server).
type SyncResult struct {
	Workers  int   `json:"workers"`
	Keys     int64 `json:"keys"`
	Resident int64 `json:"resident"`
	// SnapshotBytes is the snapshots' encoding, all workers.
	SnapshotBytes int64 `json:"snapshot_bytes"`
	// Ready is from the replica process's exec to all its workers live,
	// by the orchestrator's clock.
	Ready time.Duration `json:"ready_ns"`
	liveReport
	// Floor is restoring the same snapshots from their encoding into a
	// fresh index with no NATS, on as many goroutines as the replica has
	// cores (the generator process, after the replica has exited);
	// FloorCPU its CPU.
	Floor    time.Duration `json:"floor_ns"`
	FloorCPU time.Duration `json:"floor_cpu_ns"`
	Shared
}

// Sync runs the sync benchmark: a generator process (the embedded
// nats-server and one natsbus.Agent per worker, each serving a
// precomputed snapshot) and a replica process started once every agent
// is registered.
//
// The replica syncs Workers agents' workers of Shape's steady state; the
// generator's process also runs the restore floor, on its CPUs.
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
	// The CPU of both processes until the replica was live is counted
	// in busy; the replica's from its exec, the generator's from c0.
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

// restoreFloor restores every recorded snapshot from its encoding into
// keyed workers of a fresh index, as a replica's sink does
// (UnmarshalBinary into a reused segment, then Worker.Restore), on procs
// goroutines: what a replica's sync costs without NATS.
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
	next := make(chan int, len(recs))
	for i := range recs {
		next <- i
	}
	close(next)
	errs := make(chan error, procs)
	ws := make([]*indexer.Worker, len(recs))
	var wg sync.WaitGroup
	for range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var seg indexer.SnapshotSegment
			for i := range next {
				w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: podName(i)}, Model: benchModel, Keyed: true})
				if err != nil {
					errs <- err
					return
				}
				err = recs[i].restore(w, &seg)
				ws[i] = w
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	fl := &genDone{WallNs: time.Since(t0).Nanoseconds(), CPUNs: (proc.SelfCPU() - cpu0).Nanoseconds()}
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	for i, w := range ws {
		if w.Digest() != recs[i].Digest {
			return nil, fmt.Errorf("fleetbench: floor: worker %d's digest differs from its agent's", i)
		}
	}
	return fl, nil
}
