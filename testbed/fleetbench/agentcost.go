package fleetbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/fleet"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/embednats"
	"github.com/kvindex/kvindex/testbed/proc"
)

// AgentResult is what the agent benchmark measured of the agent process.
type AgentResult struct {
	// Rate is the new blocks a second the engine sent; Resident the
	// blocks the pod holds.
	Rate     float64 `json:"rate"`
	Resident int64   `json:"resident"`
	// CPU is the agent's CPU in cores; RSS its resident set at the end.
	CPU     float64 `json:"cpu_cores"`
	RSS     int64   `json:"rss"`
	PeakRSS int64   `json:"peak_rss"`
	// Floor is agentFloor at the same rate, in cores; Ratio CPU over it.
	Floor float64 `json:"floor_cores"`
	Ratio float64 `json:"ratio"`
	// OtherCPU is what other processes used meanwhile, in cores.
	OtherCPU   float64 `json:"other_cores"`
	LoadBefore float64 `json:"load_before"`
	LoadAfter  float64 `json:"load_after"`
}

// AgentCost runs the agent benchmark: a generator process (the embedded
// nats-server and the pod's engine churning Rate new blocks a second) and
// the kvindex agent binary beside it, configured as a deployment
// configures it, measured for Duration after Settle.
func AgentCost(ctx context.Context, o Options) (*AgentResult, error) {
	res := &AgentResult{LoadBefore: proc.LoadAvg()[0]}
	bin, err := agentBinary(o.Binary)
	if err != nil {
		return nil, err
	}
	w, err := NewWorkload(o.Shape, o.Seed)
	if err != nil {
		return nil, err
	}
	perBlock, resident, err := agentFloor(w)
	if err != nil {
		return nil, err
	}
	res.Floor, res.Resident = perBlock.Seconds()*o.Rate, resident
	gen, ready, err := startGen(ctx, "engines-gen", "", genOpts{Options: o, Batches: int(o.Rate * (o.Settle + o.Duration + time.Second).Seconds() / blocksPerBatch(w))}, time.Minute)
	if err != nil {
		return nil, err
	}
	defer gen.Kill()
	dir, err := os.MkdirTemp("", "kvfleetbench-agent-")
	if err != nil {
		return nil, fmt.Errorf("fleetbench: agent: %w", err)
	}
	defer os.RemoveAll(dir)
	cfgPath := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte(ready.Config), 0o600); err != nil {
		return nil, fmt.Errorf("fleetbench: agent: %w", err)
	}
	cmd := exec.Command(bin, "agent", "--config", cfgPath, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	agent, err := proc.Start("kvindex agent", cmd, "")
	if err != nil {
		return nil, err
	}
	defer func() { _ = agent.Stop(syscall.SIGTERM, 10*time.Second) }()
	pid := agent.Pid()
	if _, err := gen.await("subscribed", nil, time.Minute); err != nil {
		return nil, err
	}
	if err := gen.send("go"); err != nil {
		return nil, err
	}
	if _, err := gen.await("warmed", nil, 5*time.Minute); err != nil {
		return nil, err
	}
	if err := sleep(ctx, o.Settle); err != nil {
		return nil, err
	}
	cpu0, err0 := proc.CPU(pid)
	busy0, t0 := proc.BusyCPU(), time.Now()
	if err := sleep(ctx, o.Duration); err != nil {
		return nil, err
	}
	cpu1, err1 := proc.CPU(pid)
	busy1, wall := proc.BusyCPU(), time.Since(t0)
	mem, err := proc.Mem(pid)
	if err := errors.Join(err0, err1, err); err != nil {
		return nil, err
	}
	res.RSS, res.PeakRSS = mem.RSS, mem.Peak
	res.CPU = (cpu1 - cpu0).Seconds() / wall.Seconds()
	var done genDone
	if _, err := gen.await("done", &done, time.Minute); err != nil {
		return nil, err
	}
	gcpu := (busy1 - busy0 - (cpu1 - cpu0)).Seconds() / wall.Seconds()
	res.OtherCPU = max(0, gcpu) // the generator's engine and nats-server included
	res.Rate = done.rate()
	if res.Floor > 0 {
		res.Ratio = res.CPU / res.Floor
	}
	if err := gen.finish(time.Minute); err != nil {
		return nil, err
	}
	res.LoadAfter = proc.LoadAvg()[0]
	return res, nil
}

// agentBinary finds the kvindex binary.
func agentBinary(path string) (string, error) {
	if path != "" {
		return path, nil
	}
	if self, err := os.Executable(); err == nil {
		if p, err := exec.LookPath(filepath.Join(filepath.Dir(self), "kvindex")); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("kvindex")
	if err != nil {
		return "", fmt.Errorf("fleetbench: agent: no kvindex binary beside this one or on PATH (go build -o bin/ ./cmd/...): %w", err)
	}
	return p, nil
}

// agentFloor returns the CPU per new block of the index's share of an
// agent's work on w's steady stream (decoding the engine's payloads,
// ApplyBatchDelta, the conversion to the wire model; no sockets, no
// NATS), on one goroutine with GOMAXPROCS 1, and the blocks it holds.

func agentFloor(w *Workload) (time.Duration, int64, error) {
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel(benchModel, w.shape.BlockSize); err != nil {
		return 0, 0, err
	}
	wk, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: podName(0)}, Model: benchModel})
	if err != nil {
		return 0, 0, err
	}
	var f Filler
	payloads := make([][]byte, w.Len())
	for i := range w.Len() {
		if err := wk.ApplyBatch(f.Fill(w, i, 0, 0)); err != nil {
			return 0, 0, fmt.Errorf("fleetbench: agent floor: %w", err)
		}
		if payloads[i], err = events.AppendPayload(nil, f.Fill(w, i, 1, 1), events.EncodeOptions{}); err != nil {
			return 0, 0, fmt.Errorf("fleetbench: agent floor: %w", err)
		}
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	dec := events.NewDecoder()
	var b events.Batch
	var d indexer.Delta
	var wire events.Delta
	blocks := 0
	cpu0 := proc.SelfCPU()
	for range 2 {
		for i, p := range payloads {
			if err := dec.Decode(p, &b); err != nil {
				return 0, 0, fmt.Errorf("fleetbench: agent floor: %w", err)
			}
			d.Reset()
			if err := wk.ApplyBatchDelta(&b, &d); err != nil {
				return 0, 0, fmt.Errorf("fleetbench: agent floor: %w", err)
			}
			wire.Reset()
			fleet.ToWire(&d, &wire)
			blocks += w.Stored[i]
		}
	}
	return (proc.SelfCPU() - cpu0) / time.Duration(blocks), wk.Stats().ResidentBlocks, nil
}

func runEnginesGenerator(ctx context.Context, o genOpts, in *Commands, out *Reporter) error {
	ns, err := embednats.Start("kvfleetbench")
	if err != nil {
		return err
	}
	defer ns.Close()
	es, err := startEngines(1, o.Shape, o.Seed)
	if err != nil {
		return err
	}
	defer closeEngines(es)
	cfg, err := es[0].agentConfig(ns.URL())
	if err != nil {
		return err
	}
	y, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("fleetbench: agent configuration: %w", err)
	}
	if err := out.Send("ready", genReady{URL: ns.URL(), Config: string(y)}); err != nil {
		return err
	}
	if err := waitSubscribed(ctx, es, 1); err != nil {
		return err
	}
	if err := out.Send("subscribed", struct{}{}); err != nil {
		return err
	}
	if err := in.Wait(ctx, "go"); err != nil {
		return err
	}
	if _, err := playEngines(ctx, es, es[0].w.Len(), o.WarmRate); err != nil {
		return err
	}
	if err := out.Send("warmed", struct{}{}); err != nil {
		return err
	}
	t0 := time.Now()
	blocks, err := playEngines(ctx, es, o.Batches, o.Rate)
	if err != nil {
		return err
	}
	if err := out.Send("done", genDone{Blocks: blocks, WallNs: time.Since(t0).Nanoseconds()}); err != nil {
		return err
	}
	return in.Exit(ctx)
}
