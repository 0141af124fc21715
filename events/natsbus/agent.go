package natsbus

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/defaults"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

// LocalWorker is an agent's own index worker, fed by its engine's events.
type LocalWorker interface {
	// Snapshot emits the resident set as segments in the index's encoding
	// (emit copies what it keeps), consistent with the last delta published;
	// blocks is the number of keys with references.
	Snapshot(emit func(segment []byte) error) (blocks uint64, err error)
	// Resident and Capacity are block counts for the registration (0: unknown).
	Resident() int64
	Capacity() int64
	// Health is the engine stream's health and why it is not OK.
	Health() (events.Health, string)
}

// AgentOptions configure an Agent.
type AgentOptions struct {
	// Bucket is the agents' key-value bucket; "" means DefaultBucket.
	Bucket string
	// TTL is a registration's life without a heartbeat (0 means 10 s);
	// Heartbeat its refresh period (0 means TTL / 4).
	TTL, Heartbeat time.Duration
	// Model, BlockSize and KeyScheme describe what the pod serves and how
	// content keys are computed.
	Model     string
	BlockSize int
	KeyScheme string
	// Pod names the pod; its workers are its DP ranks.
	Pod string
	// Version is the agent's build, for the registration.
	Version string
	// ChunkBytes is the size from which a snapshot chunk (whole segments) is
	// sent; 0 means 256 KiB, under NATS's 1 MiB payload with ~40 KB segments.
	ChunkBytes int
	// Logger receives problem reports; nil discards them.
	Logger *slog.Logger
}

// Agent publishes one pod's workers on NATS: deltas numbered per worker
// within the agent's epoch, snapshots on request, and registrations
// refreshed by heartbeat so that a dead agent's workers expire. Publish and
// the snapshot responder serialise on the worker's mutex, so a snapshot is
// the state after exactly the seq it states.
type Agent struct {
	nc    *nats.Conn
	kvMu  sync.Mutex         // guards kv
	kv    jetstream.KeyValue // nil until the bucket is first opened
	o     AgentOptions
	epoch uint64
	log   *slog.Logger

	workers map[int]*agentWorker
	kick    chan struct{} // a registration changed (SetPartial): Run rewrites them now

	published, bytes atomic.Int64
	snapshots        atomic.Int64
}

// agentWorker is one worker's publishing state.
type agentWorker struct {
	ref      events.WorkerRef
	local    LocalWorker
	deltaSub string
	snapSub  string
	key      string
	sub      *nats.Subscription

	mu       sync.Mutex // guards seq, msg, partial and the apply-publish pairing
	seq      uint64
	msg      fleetv1.Delta
	buf      []byte
	delta    events.Delta
	partial  bool
	engSeq   uint64
	engSeqOK bool
}

// NewAgent registers the pod's workers (by rank), serves their snapshots,
// and returns the agent with a new random epoch; Run keeps them registered.
func NewAgent(ctx context.Context, nc *nats.Conn, o AgentOptions, workers map[int]LocalWorker) (*Agent, error) {
	defaults.Zero(&o.Bucket, DefaultBucket)
	defaults.Positive(&o.TTL, 10*time.Second)
	defaults.Positive(&o.Heartbeat, o.TTL/4)
	defaults.Positive(&o.ChunkBytes, 256<<10)
	defaults.Zero(&o.Logger, slog.New(slog.DiscardHandler))
	if o.Model == "" || o.Pod == "" || o.BlockSize <= 0 {
		return nil, fmt.Errorf("nats: agent: model, pod and block size are required")
	}
	a := &Agent{nc: nc, o: o, epoch: newEpoch(), log: o.Logger, workers: map[int]*agentWorker{}, kick: make(chan struct{}, 1)}
	var err error
	for rank, lw := range workers {
		ref := events.WorkerRef{Pod: o.Pod, DPRank: rank}
		w := &agentWorker{ref: ref, local: lw, deltaSub: DeltaSubject(o.Model, ref), snapSub: SnapshotSubject(o.Model, ref), key: WorkerKey(o.Model, ref)}
		if w.sub, err = nc.Subscribe(w.snapSub, func(m *nats.Msg) { a.serveSnapshot(w, m) }); err != nil {
			a.Close(ctx)
			return nil, fmt.Errorf("nats: agent: subscribe %s: %w", w.snapSub, err)
		}
		a.workers[rank] = w
	}
	// NATS may be unreachable yet: the heartbeat retries, and events indexed
	// meanwhile reach replicas by snapshot.
	if nc.IsConnected() {
		if err := nc.FlushTimeout(time.Second); err != nil {
			a.log.Warn("agent: NATS does not answer yet; registering on the next heartbeat", "err", err)
		}
		for _, w := range a.workers {
			if err := a.register(ctx, w); err != nil {
				a.log.Warn("agent: first registration failed; retrying on the heartbeat", "worker", w.ref.String(), "err", err)
			}
		}
	}
	return a, nil
}

// bucket returns the agents' bucket, opening it on first use.
func (a *Agent) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	a.kvMu.Lock()
	defer a.kvMu.Unlock()
	if a.kv == nil {
		kv, err := Bucket(ctx, a.nc, a.o.Bucket, a.o.TTL)
		if err != nil {
			return nil, err
		}
		a.kv = kv
	}
	return a.kv, nil
}

// Bucket opens or creates the agents' bucket, entries living ttl, with
// delete markers on expiry so that watchers hear of it.
func Bucket(ctx context.Context, nc *nats.Conn, name string, ttl time.Duration) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("nats: JetStream: %w", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         name,
		Description:    "kvindex agents: one entry per worker, refreshed by heartbeat",
		TTL:            ttl,
		LimitMarkerTTL: max(ttl, time.Second),
		History:        1,
	})
	if err != nil {
		return nil, fmt.Errorf("nats: key-value bucket %s: %w", name, err)
	}
	return kv, nil
}

// newEpoch returns a random, non-zero epoch.
func newEpoch() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if e := binary.BigEndian.Uint64(b[:]); e != 0 {
			return e
		}
	}
}

// Epoch returns the agent's epoch.
func (a *Agent) Epoch() uint64 { return a.epoch }

// ErrUnknownRank: Publish named a rank the agent does not serve.
var ErrUnknownRank = errors.New("nats: agent: unknown dp rank")

// Publish applies one engine batch (engineSeq, engineTime) to worker rank
// and publishes its effects: apply fills a reset delta for the given seq
// under the worker's lock, so no snapshot falls between the change and its
// seq. A delta with no entries and no layout is not published and takes
// no seq.
func (a *Agent) Publish(rank int, engineSeq uint64, engineTime float64, apply func(seq uint64, d *events.Delta) error) error {
	w := a.workers[rank]
	if w == nil {
		return fmt.Errorf("%w %d", ErrUnknownRank, rank)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.delta.Reset()
	err := apply(w.seq+1, &w.delta)
	w.engSeq, w.engSeqOK = engineSeq, true
	if len(w.delta.Entries) == 0 && len(w.delta.Layout) == 0 {
		return err
	}
	w.seq++
	encodeDelta(&w.msg, deltaHeader{epoch: a.epoch, seq: w.seq, engineSeq: engineSeq, engineTime: engineTime}, &w.delta)
	w.buf, _ = proto.MarshalOptions{}.MarshalAppend(w.buf[:0], &w.msg)
	if perr := a.nc.Publish(w.deltaSub, w.buf); perr != nil {
		a.log.Warn("publishing a delta failed; replicas will resync", "worker", w.ref.String(), "seq", w.seq, "err", perr)
		return errors.Join(err, fmt.Errorf("nats: publish delta %d of %s: %w", w.seq, w.ref, perr))
	}
	a.published.Add(1)
	a.bytes.Add(int64(len(w.buf)))
	return err
}

// SetPartial marks worker rank's state as lacking part of its engine's
// history (a restore whose replay left a hole), or whole again; Run registers
// a change at once. Not from inside Publish's apply or WithWorker's f.
func (a *Agent) SetPartial(rank int, partial bool) {
	w := a.workers[rank]
	if w == nil {
		return
	}
	w.mu.Lock()
	changed := w.partial != partial
	w.partial = partial
	w.mu.Unlock()
	if changed {
		select {
		case a.kick <- struct{}{}:
		default: // one is pending already
		}
	}
}

// EngineSeq returns the last engine seq worker rank published.
func (a *Agent) EngineSeq(rank int) (seq uint64, ok bool) {
	_ = a.WithWorker(rank, func(s uint64, has bool) error {
		seq, ok = s, has
		return nil
	})
	return seq, ok
}

// WithWorker runs f under worker rank's lock, consistent with the engine
// seq it is given (for a checkpoint).
func (a *Agent) WithWorker(rank int, f func(engineSeq uint64, hasSeq bool) error) error {
	w := a.workers[rank]
	if w == nil {
		return fmt.Errorf("%w %d", ErrUnknownRank, rank)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return f(w.engSeq, w.engSeqOK)
}

// AgentStats count published deltas and their bytes, and snapshots served.
type AgentStats struct {
	Deltas, Bytes, Snapshots int64
}

// Stats returns the agent's counters.
func (a *Agent) Stats() AgentStats {
	return AgentStats{Deltas: a.published.Load(), Bytes: a.bytes.Load(), Snapshots: a.snapshots.Load()}
}

// serveSnapshot answers a snapshot request: the state taken under the lock
// with its seq, in chunks of about ChunkBytes. Each segment is copied once,
// into its chunk; the headers (needing the block count) are appended after,
// and the chunks sent with no lock held.
func (a *Agent) serveSnapshot(w *agentWorker, m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	var chunks [][]byte
	var cur []byte
	w.mu.Lock()
	seq := w.seq
	blocks, err := w.local.Snapshot(func(seg []byte) error {
		if cur == nil {
			// Room for the chunk (it ends past ChunkBytes), unless segments are small.
			cur = make([]byte, 0, min(a.o.ChunkBytes, 16*len(seg))+len(seg)+64)
		}
		cur = appendChunkSegment(cur, seg)
		if len(cur) >= a.o.ChunkBytes {
			chunks, cur = append(chunks, cur), nil
		}
		return nil
	})
	w.mu.Unlock()
	if cur != nil || len(chunks) == 0 {
		chunks = append(chunks, cur)
	}
	send := func(b []byte) bool {
		if err := a.nc.Publish(m.Reply, b); err != nil {
			a.log.Warn("sending a snapshot chunk failed", "worker", w.ref.String(), "err", err)
			return false
		}
		return true
	}
	if err != nil {
		send(appendChunkHeader(nil, chunkHeader{epoch: a.epoch, seq: seq, last: true, err: err.Error()}))
		return
	}
	for i, c := range chunks {
		last := i == len(chunks)-1
		if !send(appendChunkHeader(c, chunkHeader{epoch: a.epoch, seq: seq, index: uint32(i), blocks: blocks, last: last})) {
			return
		}
	}
	a.snapshots.Add(1)
}

// register writes worker w's registration.
func (a *Agent) register(ctx context.Context, w *agentWorker) error {
	h, reason := w.local.Health()
	w.mu.Lock()
	reg := &fleetv1.Registration{
		Model: a.o.Model, BlockSize: uint32(a.o.BlockSize), KeyScheme: a.o.KeyScheme,
		Pod: w.ref.Pod, DpRank: uint32(w.ref.DPRank), Epoch: a.epoch, Seq: w.seq,
		DeltaSubject: w.deltaSub, SnapshotSubject: w.snapSub,
		Health: h.String(), HealthReason: reason,
		Capacity: uint64(max(w.local.Capacity(), 0)), Resident: uint64(max(w.local.Resident(), 0)),
		AgentVersion: a.o.Version, HeartbeatUnixMs: time.Now().UnixMilli(), Partial: w.partial,
	}
	w.mu.Unlock()
	b, err := proto.Marshal(reg)
	if err != nil {
		return fmt.Errorf("nats: agent: registration of %s: %w", w.ref, err)
	}
	kv, err := a.bucket(ctx)
	if err == nil {
		_, err = kv.Put(ctx, w.key, b)
	}
	if err != nil {
		return fmt.Errorf("nats: agent: register %s: %w", w.ref, err)
	}
	return nil
}

// Run refreshes the registrations every Heartbeat and on SetPartial until ctx
// is done, then removes them.
func (a *Agent) Run(ctx context.Context) {
	t := time.NewTicker(a.o.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			a.Close(cctx)
			cancel()
			return
		case <-t.C:
		case <-a.kick:
		}
		for _, w := range a.workers {
			if err := a.register(ctx, w); err != nil && ctx.Err() == nil {
				a.log.Warn("agent heartbeat failed", "worker", w.ref.String(), "err", err)
			}
		}
	}
}

// Close stops serving snapshots and deletes the registrations, so replicas
// drop the workers now rather than at the TTL.
func (a *Agent) Close(ctx context.Context) {
	a.kvMu.Lock()
	kv := a.kv
	a.kvMu.Unlock()
	for _, w := range a.workers {
		if w.sub != nil {
			_ = w.sub.Unsubscribe()
		}
		if kv != nil {
			_ = kv.Delete(ctx, w.key)
		}
	}
}
