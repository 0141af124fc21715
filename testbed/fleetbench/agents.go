package fleetbench

import (
	"bufio"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/events/natsbus"
	"github.com/kvindex/kvindex/indexer"
)

// podName names generator worker i's pod.
func podName(i int) string { return fmt.Sprintf("pod-%04d", i) }

// fixedAgents are a generator's agents: one natsbus.Agent per recorded
// worker, each with a NATS connection of its own.
type fixedAgents struct {
	conns   []*nats.Conn
	agents  []*natsbus.Agent
	workers []*fixedWorker
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// startAgents starts one agent per recorded worker against url, each
// registered when it returns, running until stop or ctx ends.
func startAgents(ctx context.Context, url string, recs []*Recorded, blockSize int) (*fixedAgents, error) {
	fa := &fixedAgents{}
	ctx, fa.cancel = context.WithCancel(ctx)
	for i, rec := range recs {
		nc, err := connect(url, "kvfleetbench agent "+podName(i))
		if err != nil {
			fa.stop()
			return nil, err
		}
		fa.conns = append(fa.conns, nc)
		fw := &fixedWorker{rec: rec}
		a, err := natsbus.NewAgent(ctx, nc, natsbus.AgentOptions{Model: benchModel, BlockSize: blockSize, KeyScheme: indexer.KeyScheme,
			Pod: podName(i), Version: "kvfleetbench"}, map[int]natsbus.LocalWorker{0: fw})
		if err != nil {
			fa.stop()
			return nil, fmt.Errorf("fleetbench: agent %d: %w", i, err)
		}
		fa.agents = append(fa.agents, a)
		fa.workers = append(fa.workers, fw)
		fa.wg.Add(1)
		go func() {
			defer fa.wg.Done()
			a.Run(ctx)
		}()
	}
	return fa, nil
}

// connect opens a plain client connection (replicas use fleet.Connect).
func connect(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("fleetbench: connect %s: %w", url, err)
	}
	return nc, nil
}

// stop ends the agents' Run and closes their connections.
func (fa *fixedAgents) stop() {
	fa.cancel()
	fa.wg.Wait()
	for _, nc := range fa.conns {
		nc.Close()
	}
}

// loadRecorded records snapshots (some 40 ms each) or reads them back
// from a cache file in dir (gob), named after what made them.
func loadRecorded(dir string, shape Shape, seed uint64, workers int) ([]*Recorded, error) {
	if dir == "" {
		return RecordAll(shape, seed, workers, false)
	}
	id, _ := json.Marshal(struct {
		Format  string
		S       Shape
		Seed    uint64
		Workers int
		Key     string
	}{"gob 1", shape, seed, workers, indexer.KeyScheme})
	h := fnv.New64a()
	h.Write(id)
	path := filepath.Join(dir, fmt.Sprintf("fleet-snapshots-%016x.gob", h.Sum64()))
	var recs []*Recorded
	if f, err := os.Open(path); err == nil {
		err = gob.NewDecoder(bufio.NewReaderSize(f, 1<<20)).Decode(&recs)
		_ = f.Close()
		if err == nil && len(recs) == workers {
			return recs, nil
		}
	}
	recs, err := RecordAll(shape, seed, workers, false)
	if err != nil {
		return nil, err
	}
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return nil, fmt.Errorf("fleetbench: snapshot cache: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	err = errors.Join(gob.NewEncoder(w).Encode(recs), w.Flush(), f.Close())
	if err == nil {
		err = os.Rename(path+".tmp", path)
	}
	if err != nil {
		return nil, fmt.Errorf("fleetbench: snapshot cache %s: %w", path, err)
	}
	return recs, nil
}
