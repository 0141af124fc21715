package fleetbench

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/events/natsbus"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/embednats"
)

// podName names generator worker i's pod.
func podName(i int) string { return fmt.Sprintf("pod-%04d", i) }

// fixedAgents are a generator's agents: one natsbus.Agent per recorded
// worker, each a pod of one DP rank with a NATS connection of its own, as
// a fleet's agents are.
type fixedAgents struct {
	ns      *embednats.Server // nil until startFixed sets it
	conns   []*nats.Conn
	agents  []*natsbus.Agent
	workers []*fixedWorker
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// startAgents starts one agent per recorded worker against url, each
// registered (the bucket's entries written) when it returns; their
// heartbeats run until stop or ctx ends.
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

// startFixed starts the embedded nats-server and one agent per recorded
// worker against it (stop stops both), and returns the generator's
// "ready" with its URL and the workers' digests.
func startFixed(ctx context.Context, recs []*Recorded, blockSize int) (*fixedAgents, *genReady, error) {
	ns, err := embednats.Start("kvfleetbench")
	if err != nil {
		return nil, nil, err
	}
	fa, err := startAgents(ctx, ns.URL(), recs, blockSize)
	if err != nil {
		ns.Close()
		return nil, nil, err
	}
	fa.ns = ns
	return fa, &genReady{URL: ns.URL(), Digests: fa.digests()}, nil
}

// connect opens a plain client connection (the generator's agents; the
// replicas use fleet.Connect, as kvindex serve does).
func connect(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("fleetbench: connect %s: %w", url, err)
	}
	return nc, nil
}

// digests returns the workers' digests by pod, as the replica reports them.
func (fa *fixedAgents) digests() map[string]string {
	m := map[string]string{}
	for i, w := range fa.workers {
		m[podName(i)] = strconv.FormatUint(w.rec.Digest, 16)
	}
	return m
}

// stop ends the agents' Run, closes their connections and stops the
// nats-server.
func (fa *fixedAgents) stop() {
	fa.cancel()
	fa.wg.Wait()
	for _, nc := range fa.conns {
		nc.Close()
	}
	if fa.ns != nil {
		fa.ns.Close()
	}
}

// Recorded snapshots of many workers take some 40 ms each to make (a lap
// of the ring applied, then the snapshot): 1,000 of them, 20 s on two
// cores. loadRecorded keeps them in a cache file (about 10 bytes a key)
// named after what made them, so later runs read them back.

// cacheFormat starts a cache file; a change of the format changes it.
const cacheFormat = "kvfleetbench snapshots 1\n"

// loadRecorded returns the snapshots of workers workloads of shape from
// seed on, from dir's cache file when it has one, else recorded (and
// cached, when dir is set).
func loadRecorded(dir string, shape Shape, seed uint64, workers int) ([]*Recorded, error) {
	if dir == "" {
		return RecordAll(shape, seed, workers, false)
	}
	id, _ := json.Marshal(struct {
		S       Shape
		Seed    uint64
		Workers int
		Key     string
	}{shape, seed, workers, indexer.KeyScheme})
	h := fnv.New64a()
	h.Write(id)
	path := filepath.Join(dir, fmt.Sprintf("fleet-snapshots-%016x.bin", h.Sum64()))
	if recs, err := readRecorded(path, workers); err == nil {
		return recs, nil
	}
	recs, err := RecordAll(shape, seed, workers, false)
	if err != nil {
		return nil, err
	}
	if err := writeRecorded(path, recs); err != nil {
		return nil, err
	}
	return recs, nil
}

func writeRecorded(path string, recs []*Recorded) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("fleetbench: snapshot cache: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	_, _ = w.WriteString(cacheFormat)
	var b []byte
	for _, r := range recs {
		b = binary.AppendUvarint(b[:0], uint64(r.Resident))
		b = binary.AppendUvarint(b, r.Digest)
		b = binary.AppendUvarint(b, uint64(r.Keys))
		b = binary.AppendUvarint(b, uint64(len(r.Segments)))
		for _, s := range r.Segments {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
		_, _ = w.Write(b)
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return fmt.Errorf("fleetbench: snapshot cache: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("fleetbench: snapshot cache: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("fleetbench: snapshot cache: %w", err)
	}
	return nil
}

func readRecorded(path string, workers int) ([]*Recorded, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < len(cacheFormat) || string(b[:len(cacheFormat)]) != cacheFormat {
		return nil, fmt.Errorf("fleetbench: %s: not a snapshot cache", path)
	}
	b = b[len(cacheFormat):]
	bad := fmt.Errorf("fleetbench: %s: truncated", path)
	next := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			b = nil
			return 0
		}
		b = b[n:]
		return v
	}
	recs := make([]*Recorded, workers)
	for i := range recs {
		r := &Recorded{Resident: int64(next()), Digest: next(), Keys: int(next())}
		segs := next()
		for range segs {
			n := next()
			if uint64(len(b)) < n {
				return nil, bad
			}
			r.Segments = append(r.Segments, b[:n:n])
			b = b[n:]
		}
		if b == nil {
			return nil, bad
		}
		recs[i] = r
	}
	return recs, nil
}
