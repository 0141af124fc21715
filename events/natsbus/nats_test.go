package natsbus

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/events"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

// runServer starts a real NATS server in process, JetStream on, in a temp
// dir, and returns it (stopped at cleanup).
func runServer(t *testing.T) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s
}

func connect(t *testing.T, s *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// setModel is a worker's resident set as the transport sees it: key ->
// refs. It stands for the index on both sides of these transport tests
// (the index's own delta and snapshot logic has its tests in indexer).
type setModel struct {
	mu   sync.Mutex
	refs map[uint64][events.NumMedia]uint8
}

func newSetModel() *setModel { return &setModel{refs: map[uint64][events.NumMedia]uint8{}} }

func (m *setModel) ApplyDelta(_ uint64, d *events.Delta) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range d.Entries {
		r := m.refs[e.Key]
		switch e.Op {
		case events.DeltaStore:
			r[e.Medium]++
		case events.DeltaRemove:
			if r[e.Medium] == 0 {
				return fmt.Errorf("remove of a key not held")
			}
			r[e.Medium]--
		case events.DeltaClear:
			clear(m.refs)
			continue
		}
		if r == ([events.NumMedia]uint8{}) {
			delete(m.refs, e.Key)
		} else {
			m.refs[e.Key] = r
		}
	}
	return nil
}

// Snapshot emits one segment per key: the key, then its refs.
func (m *setModel) Snapshot(emit func([]byte) error) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(m.refs)) {
		r := m.refs[k]
		if err := emit(append(binary.LittleEndian.AppendUint64(nil, k), r[:]...)); err != nil {
			return 0, err
		}
	}
	return uint64(len(m.refs)), nil
}

func (m *setModel) Restore(next func() ([]byte, error)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.refs)
	for {
		b, err := next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if len(b) != 8+events.NumMedia {
			return fmt.Errorf("segment of %d bytes", len(b))
		}
		var r [events.NumMedia]uint8
		copy(r[:], b[8:])
		m.refs[binary.LittleEndian.Uint64(b)] = r
	}
}

func (m *setModel) Reset(string) {
	m.mu.Lock()
	clear(m.refs)
	m.mu.Unlock()
}
func (m *setModel) Resident() int64                 { m.mu.Lock(); defer m.mu.Unlock(); return int64(len(m.refs)) }
func (m *setModel) Capacity() int64                 { return 0 }
func (m *setModel) Health() (events.Health, string) { return events.HealthOK, "" }

func (m *setModel) keys() []uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.refs))
}

// replicaSet is a WorkerSet of setModels.
type replicaSet struct {
	mu      sync.Mutex
	workers map[events.WorkerRef]*setModel
	removed []events.WorkerRef
}

func (r *replicaSet) AddWorker(ref events.WorkerRef, reg *fleetv1.Registration) (KeyedSink, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := newSetModel()
	r.workers[ref] = m
	return m, nil
}

func (r *replicaSet) RemoveWorker(ref events.WorkerRef) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.workers, ref)
	r.removed = append(r.removed, ref)
}

func (r *replicaSet) worker(ref events.WorkerRef) *setModel {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.workers[ref]
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// store publishes a delta storing keys on the agent's worker model.
func store(t *testing.T, a *Agent, m *setModel, rank int, keys ...uint64) {
	t.Helper()
	err := a.Publish(rank, 0, 0, func(_ uint64, d *events.Delta) error {
		for _, k := range keys {
			d.Entries = append(d.Entries, events.DeltaEntry{Op: events.DeltaStore, Key: k})
		}
		return m.ApplyDelta(0, d)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// An agent's workers are discovered through the bucket; a replica loads
// their snapshots, follows their deltas, resyncs after a gap and after the
// agent restarts (a new epoch), and forgets them when they are removed.
func TestAgentToReplica(t *testing.T) {
	s := runServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	local := map[int]*setModel{0: newSetModel(), 1: newSetModel()}
	lw := map[int]LocalWorker{0: local[0], 1: local[1]}
	opts := AgentOptions{Model: "org/m.v1", BlockSize: 16, KeyScheme: "test", Pod: "pod.a", TTL: 2 * time.Second}
	a, err := NewAgent(ctx, connect(t, s), opts, lw)
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(ctx)
	go a.Run(actx)
	store(t, a, local[0], 0, 1, 2, 3) // before any replica: in the snapshot

	set := &replicaSet{workers: map[events.WorkerRef]*setModel{}}
	src := NewSource(connect(t, s), set, SourceOptions{TTL: 2 * time.Second})
	go func() { _ = src.Run(ctx) }()
	r0 := events.WorkerRef{Pod: "pod.a", DPRank: 0}
	waitFor(t, "both workers discovered and in sync", func() bool {
		w := set.worker(r0)
		return w != nil && set.worker(events.WorkerRef{Pod: "pod.a", DPRank: 1}) != nil && len(w.keys()) == 3 && src.Health(r0).Load() == events.HealthOK
	})
	store(t, a, local[0], 0, 4)
	waitFor(t, "a live delta", func() bool { return slices.Equal(set.worker(r0).keys(), []uint64{1, 2, 3, 4}) })

	// A lost delta: the agent's seq moves on without publishing.
	a.workers[0].mu.Lock()
	a.workers[0].seq++
	local[0].refs[5] = [events.NumMedia]uint8{1}
	a.workers[0].mu.Unlock()
	store(t, a, local[0], 0, 6)
	waitFor(t, "the resync after a gap", func() bool { return slices.Equal(set.worker(r0).keys(), []uint64{1, 2, 3, 4, 5, 6}) })
	var st events.WorkerStats
	for _, x := range src.WorkerStats() {
		if x.Worker == r0 {
			st = x
		}
	}
	if st.Gaps != 1 || st.Replays < 2 {
		t.Fatalf("after a gap: %+v", st)
	}

	// The agent restarts with the same engine state: new epoch, resync.
	acancel()
	waitFor(t, "the workers gone with the agent", func() bool { return set.worker(r0) == nil })
	local[0].refs[7] = [events.NumMedia]uint8{1}
	a2, err := NewAgent(ctx, connect(t, s), opts, lw)
	if err != nil {
		t.Fatal(err)
	}
	go a2.Run(ctx)
	waitFor(t, "the restarted agent's state", func() bool {
		w := set.worker(r0)
		return w != nil && slices.Equal(w.keys(), []uint64{1, 2, 3, 4, 5, 6, 7})
	})
	if a2.Epoch() == a.Epoch() {
		t.Fatal("a restarted agent kept its epoch")
	}
}

// A registration that stops being refreshed expires: the replica forgets
// the worker after the TTL.
func TestRegistrationExpires(t *testing.T) {
	s := runServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := newSetModel()
	a, err := NewAgent(ctx, connect(t, s), AgentOptions{Model: "m", BlockSize: 16, Pod: "p", TTL: time.Second}, map[int]LocalWorker{0: m})
	if err != nil {
		t.Fatal(err)
	}
	_ = a // no Run: no heartbeat, as a killed agent
	set := &replicaSet{workers: map[events.WorkerRef]*setModel{}}
	src := NewSource(connect(t, s), set, SourceOptions{TTL: time.Second})
	go func() { _ = src.Run(ctx) }()
	ref := events.WorkerRef{Pod: "p"}
	waitFor(t, "discovery", func() bool { return set.worker(ref) != nil })
	waitFor(t, "expiry", func() bool { return set.worker(ref) == nil })
}

// partialModel is a setModel whose agent-side health says why it is
// partial, as the fleet agent's workers do.
type partialModel struct {
	*setModel
	why string
}

func (m *partialModel) Health() (events.Health, string) {
	if m.why != "" {
		return events.HealthUnsynced, m.why
	}
	return events.HealthOK, ""
}

// A worker the agent marks partial is registered so at once (well before
// the next heartbeat): the replica shows it UNSYNCED, with the agent's
// reason, and OK again when the agent marks it whole.
func TestPartialRegistration(t *testing.T) {
	s := runServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := &partialModel{setModel: newSetModel()}
	// A heartbeat far off: only SetPartial's own registration can be seen.
	a, err := NewAgent(ctx, connect(t, s), AgentOptions{Model: "m", BlockSize: 16, Pod: "p", TTL: time.Minute, Heartbeat: time.Hour},
		map[int]LocalWorker{0: m})
	if err != nil {
		t.Fatal(err)
	}
	go a.Run(ctx)
	set := &replicaSet{workers: map[events.WorkerRef]*setModel{}}
	src := NewSource(connect(t, s), set, SourceOptions{TTL: time.Minute})
	go func() { _ = src.Run(ctx) }()
	ref := events.WorkerRef{Pod: "p"}
	stats := func() events.WorkerStats {
		for _, st := range src.WorkerStats() {
			if st.Worker == ref {
				return st
			}
		}
		return events.WorkerStats{}
	}
	waitFor(t, "the worker in sync", func() bool { return src.Health(ref).Load() == events.HealthOK })
	m.why = "batches 0..99 are beyond the engine's replay buffer"
	a.SetPartial(0, true)
	if !a.Partial(0) {
		t.Fatal("Partial is false after SetPartial(true)")
	}
	waitFor(t, "the replica to show the worker partial", func() bool { return src.Health(ref).Load() == events.HealthUnsynced })
	want := "the agent's state lacks part of the engine's history: batches 0..99 are beyond the engine's replay buffer"
	if got := stats().HealthReason; got != want {
		t.Fatalf("reason %q, want %q", got, want)
	}
	m.why = ""
	a.SetPartial(0, false)
	waitFor(t, "the worker whole again", func() bool { return src.Health(ref).Load() == events.HealthOK && stats().HealthReason == "" })
}
