package fleet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/lograte"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

// The agent's checkpoint file. It holds one fleetv1.Checkpoint, framed:
//
//	magic "KVXCKPT\n" (8 bytes) | payload length (8, little-endian) | CRC-32C of the payload (4, little-endian) | payload
//
// so a damaged file is told by its bytes alone (garbage may parse as a
// protobuf, and a wrong seq would resume the stream at the wrong place).
// Each worker's segments are indexer.CheckpointSegment's encoding. It is
// written atomically (temp file, sync, rename, directory sync). Cost: the
// state is taken under the worker's lock, holding up that worker's
// batches only (docs/benchmarks.md, "Checkpoints").
const (
	checkpointMagic   = "KVXCKPT\n"
	checkpointVersion = 1 // the fleetv1.Checkpoint format written and read
	checkpointHeader  = len(checkpointMagic) + 8 + 4
)

// maxCheckpointBytes bounds the file the agent reads: a protobuf's
// limit, far above any pod's state (10 M blocks take about 190 MB).
const maxCheckpointBytes = 2 << 30

// Errors reading a checkpoint, wrapped with the file and what is wrong.
var (
	// ErrCorruptCheckpoint: the file is not a checkpoint, is truncated,
	// damaged, or its state is inconsistent; it is ignored.
	ErrCorruptCheckpoint = errors.New("fleet: corrupt checkpoint")
	// ErrForeignCheckpoint: the file is a valid checkpoint of another
	// pod, model, key scheme, block size or format version; it is ignored.
	ErrForeignCheckpoint = errors.New("fleet: checkpoint of another agent")
)

// crcTable is CRC-32C's (hardware-accelerated on amd64 and arm64).
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Results of loading the checkpoint at start, the label values of
// kvindex_agent_checkpoint_loads_total.
const (
	loadRestored   = "restored"
	loadMissing    = "missing"
	loadUnreadable = "unreadable"
	loadCorrupt    = "corrupt"
	loadForeign    = "foreign"
)

// checkpointer is the agent's checkpoint file and its counters.
type checkpointer struct {
	path    string
	log     *slog.Logger
	started time.Time

	mu sync.Mutex // serialises writes

	writes, failures atomic.Int64
	last             atomic.Int64 // unix ns the newest checkpoint on disk was taken (written, or loaded at start); 0 for none
	size             atomic.Int64 // bytes of the last checkpoint written
	loads            *prometheus.CounterVec

	logMu sync.Mutex // guards logl
	logl  lograte.Limiter
}

// collectors are the checkpoint's metrics.
func (c *checkpointer) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		c.loads,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_agent_checkpoint_writes_total", Help: "Checkpoints the agent wrote."},
			func() float64 { return float64(c.writes.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_agent_checkpoint_write_failures_total", Help: "Checkpoint writes that failed (the previous checkpoint stays in place)."},
			func() float64 { return float64(c.failures.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvindex_agent_checkpoint_age_seconds", Help: "Age of the newest checkpoint on disk (the last written, or the one restored at start); since the agent started while there is none. A restart recovers with no loss only if the engine's replay buffer covers this long."},
			func() float64 { return c.age(time.Now()).Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvindex_agent_checkpoint_bytes", Help: "Size of the last checkpoint written."},
			func() float64 { return float64(c.size.Load()) }),
	}
}

func (c *checkpointer) age(now time.Time) time.Duration {
	if ns := c.last.Load(); ns != 0 {
		return now.Sub(time.Unix(0, ns))
	}
	return now.Sub(c.started)
}

func (c *checkpointer) problem(msg string, err error) {
	c.logMu.Lock()
	ok, held := c.logl.Allow(time.Now(), time.Minute)
	c.logMu.Unlock()
	if ok {
		c.log.Warn(msg, "path", c.path, "err", err, "suppressed", held)
	}
}

// CheckpointStats are the agent's checkpoint counters.
type CheckpointStats struct {
	// Writes and Failures count checkpoint writes and failed ones.
	Writes, Failures int64
	// Last is when the newest checkpoint was taken (zero: none); Bytes
	// the size of the last one written.
	Last  time.Time
	Bytes int64
}

// CheckpointStats returns the checkpoint counters (zero without one).
func (a *Agent) CheckpointStats() CheckpointStats {
	if a.ck == nil {
		return CheckpointStats{}
	}
	s := CheckpointStats{Writes: a.ck.writes.Load(), Failures: a.ck.failures.Load(), Bytes: a.ck.size.Load()}
	if ns := a.ck.last.Load(); ns != 0 {
		s.Last = time.Unix(0, ns)
	}
	return s
}

// WriteCheckpoint writes the agent's checkpoint now, each worker's state
// taken under its NATS agent lock with the engine seq it includes.
func (a *Agent) WriteCheckpoint() error {
	if a.ck == nil {
		return errors.New("fleet: agent: no checkpoint configured (agent.checkpoint)")
	}
	a.ck.mu.Lock()
	defer a.ck.mu.Unlock()
	taken := time.Now()
	ck := &fleetv1.Checkpoint{Version: checkpointVersion, Pod: a.pod.Name, Model: a.pod.Model, KeyScheme: a.model.Keying(),
		BlockSize: uint32(a.model.ConfiguredBlockSize()), WrittenUnixMs: taken.UnixMilli()}
	for _, rank := range a.ranks {
		wc, err := a.workerCheckpoint(rank)
		if err != nil {
			a.ck.failures.Add(1)
			return fmt.Errorf("fleet: checkpoint %s: %w", a.ck.path, err)
		}
		ck.Workers = append(ck.Workers, wc)
	}
	data, err := encodeCheckpointFile(ck)
	if err == nil {
		err = writeFileAtomic(a.ck.path, data)
	}
	if err != nil {
		a.ck.failures.Add(1)
		return fmt.Errorf("fleet: checkpoint %s: %w", a.ck.path, err)
	}
	a.ck.writes.Add(1)
	a.ck.size.Store(int64(len(data)))
	a.ck.last.Store(taken.UnixNano())
	return nil
}

// workerCheckpoint takes worker rank's state, seq and partial flag.
func (a *Agent) workerCheckpoint(rank int) (*fleetv1.WorkerCheckpoint, error) {
	s := a.sinks[rank]
	wc := &fleetv1.WorkerCheckpoint{DpRank: uint32(rank)}
	err := a.na.WithWorker(rank, func(uint64, bool) error {
		// Not the NATS agent's seq: stale after a restore or a reset.
		h := s.history()
		wc.EngineSeq, wc.HasEngineSeq, wc.Partial, wc.PartialReason = h.seq, h.hasSeq, h.partial, h.why
		if !h.hasSeq {
			// Empty: a restored agent learns it from the engine's replay.
			wc.Partial, wc.PartialReason = false, ""
			return nil
		}
		return s.w.Checkpoint(func(seg *indexer.CheckpointSegment) error {
			b, err := seg.AppendBinary(nil)
			wc.Segments = append(wc.Segments, b)
			wc.Blocks = seg.TotalBlocks
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("worker %s: %w", s.w.Info().Ref, err)
	}
	return wc, nil
}

func encodeCheckpointFile(ck *fleetv1.Checkpoint) ([]byte, error) {
	payload, err := proto.Marshal(ck)
	if err != nil {
		return nil, fmt.Errorf("encoding: %w", err)
	}
	b := make([]byte, 0, checkpointHeader+len(payload))
	b = append(b, checkpointMagic...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(payload)))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(payload, crcTable))
	return append(b, payload...), nil
}

// decodeCheckpointFile unframes and decodes a checkpoint file's bytes;
// errors wrap ErrCorruptCheckpoint.
func decodeCheckpointFile(data []byte) (*fleetv1.Checkpoint, error) {
	if len(data) < checkpointHeader || string(data[:len(checkpointMagic)]) != checkpointMagic {
		n := min(len(data), len(checkpointMagic))
		return nil, fmt.Errorf("%w: not a kvindex checkpoint (%d bytes, starting %q)", ErrCorruptCheckpoint, len(data), data[:n])
	}
	size := binary.LittleEndian.Uint64(data[len(checkpointMagic):])
	sum := binary.LittleEndian.Uint32(data[len(checkpointMagic)+8:])
	payload := data[checkpointHeader:]
	if uint64(len(payload)) != size {
		return nil, fmt.Errorf("%w: %d bytes of payload, its header says %d (truncated?)", ErrCorruptCheckpoint, len(payload), size)
	}
	if got := crc32.Checksum(payload, crcTable); got != sum {
		return nil, fmt.Errorf("%w: CRC-32C %#08x, its header says %#08x", ErrCorruptCheckpoint, got, sum)
	}
	ck := &fleetv1.Checkpoint{}
	if err := proto.Unmarshal(payload, ck); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorruptCheckpoint, err)
	}
	return ck, nil
}

// writeFileAtomic writes data to path: a crash leaves old or new, never part.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	fail := func(err error) error {
		_ = f.Close()
		_ = os.Remove(tmp)
		return err
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// readCheckpointFile reads and decodes the checkpoint at path; a missing
// file is fs.ErrNotExist.
func readCheckpointFile(path string) (*fleetv1.Checkpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCheckpointBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxCheckpointBytes {
		return nil, fmt.Errorf("%w: over %d bytes", ErrCorruptCheckpoint, maxCheckpointBytes)
	}
	return decodeCheckpointFile(data)
}

// restore restores the workers from a valid checkpoint of this agent, or
// logs and counts why not and leaves them empty. NewAgent only.
func (a *Agent) restore() {
	ck, err := readCheckpointFile(a.ck.path)
	if err == nil {
		err = a.checkForeign(ck)
	}
	if err == nil {
		err = a.restoreWorkers(ck)
	}
	result := loadRestored
	switch {
	case err == nil:
		taken := time.UnixMilli(ck.GetWrittenUnixMs())
		a.ck.last.Store(taken.UnixNano())
		a.log.Info("workers restored from the checkpoint; the engine streams resume after its seqs", "path", a.ck.path,
			"taken", taken.UTC().Format(time.RFC3339Nano), "age", time.Since(taken).Round(time.Millisecond).String(), "workers", len(ck.GetWorkers()))
	case errors.Is(err, fs.ErrNotExist):
		result = loadMissing
		a.log.Info("no checkpoint yet: the workers are learned from the engines' replay", "path", a.ck.path)
	case errors.Is(err, ErrForeignCheckpoint):
		result = loadForeign
		a.log.Warn("checkpoint ignored: it is another agent's; the workers are learned from the engines' replay", "path", a.ck.path, "err", err)
	case errors.Is(err, ErrCorruptCheckpoint):
		result = loadCorrupt
		a.log.Warn("checkpoint ignored: it is corrupt; the workers are learned from the engines' replay", "path", a.ck.path, "err", err)
	default:
		result = loadUnreadable
		a.log.Warn("checkpoint ignored: it cannot be read; the workers are learned from the engines' replay", "path", a.ck.path, "err", err)
	}
	a.ck.loads.WithLabelValues(result).Inc()
}

// checkForeign checks ck's version, pod, model, key scheme and block size.
func (a *Agent) checkForeign(ck *fleetv1.Checkpoint) error {
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"format version", ck.GetVersion(), uint32(checkpointVersion)},
		{"pod", ck.GetPod(), a.pod.Name},
		{"model", ck.GetModel(), a.pod.Model},
		{"key scheme", ck.GetKeyScheme(), a.model.Keying()},
		{"block size", ck.GetBlockSize(), uint32(a.model.ConfiguredBlockSize())},
	} {
		if c.got != c.want {
			return fmt.Errorf("%w: %s %v, this agent's %v", ErrForeignCheckpoint, c.what, c.got, c.want)
		}
	}
	return nil
}

// restoreWorkers restores every worker ck has a state for, with its
// history; one bad state makes the whole checkpoint corrupt (all emptied
// again). Ranks the agent does not have are skipped.
func (a *Agent) restoreWorkers(ck *fleetv1.Checkpoint) error {
	seen := map[int]bool{}
	var restored []int
	undo := func(err error) error {
		for _, rank := range restored {
			// Not Reset: that would count a reset.
			_ = a.workers[rank].RestoreCheckpoint(func() func() (*indexer.CheckpointSegment, error) {
				done := false
				return func() (*indexer.CheckpointSegment, error) {
					if done {
						return nil, io.EOF
					}
					done = true
					return &indexer.CheckpointSegment{Last: true}, nil
				}
			}())
			s := a.sinks[rank]
			s.mu.Lock()
			s.hist = history{}
			s.mu.Unlock()
		}
		return err
	}
	for _, wc := range ck.GetWorkers() {
		rank := int(wc.GetDpRank())
		if seen[rank] {
			return undo(fmt.Errorf("%w: rank %d twice", ErrCorruptCheckpoint, rank))
		}
		seen[rank] = true
		w := a.workers[rank]
		if w == nil {
			a.log.Warn("checkpoint has a DP rank the pod no longer has; skipped", "path", a.ck.path, "rank", rank)
			continue
		}
		if !wc.GetHasEngineSeq() {
			continue // empty when taken: learned from the engine's replay
		}
		segs := wc.GetSegments()
		var seg indexer.CheckpointSegment
		i := 0
		err := w.RestoreCheckpoint(func() (*indexer.CheckpointSegment, error) {
			if i == len(segs) {
				return nil, io.EOF
			}
			i++
			if err := seg.UnmarshalBinary(segs[i-1]); err != nil {
				return nil, err
			}
			return &seg, nil
		})
		if err != nil {
			return undo(fmt.Errorf("%w: worker %s: %w", ErrCorruptCheckpoint, w.Info().Ref, err))
		}
		restored = append(restored, rank)
		if got := w.Stats().ResidentBlocks; uint64(got) < wc.GetBlocks() {
			// Not corruption: a capacity lowered since.
			a.log.Info("restored worker evicted to its capacity", "worker", w.Info().Ref.String(), "checkpointed", wc.GetBlocks(), "resident", got)
		}
		h := history{seq: wc.GetEngineSeq(), hasSeq: true, known: true, restored: true}
		if wc.GetPartial() {
			h.partial, h.why = true, "restored from a checkpoint of a partial state: "+wc.GetPartialReason()
		}
		s := a.sinks[rank]
		s.mu.Lock()
		s.hist = h
		s.mu.Unlock()
	}
	for _, rank := range restored {
		if a.sinks[rank].history().partial {
			a.partials.WithLabelValues(reasonCheckpoint).Inc()
		}
	}
	return nil
}
