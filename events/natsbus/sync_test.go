package natsbus

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

// slowSet is a replicaSet whose restores take a while and are counted:
// how many run at once, at most.
type slowSet struct {
	replicaSet
	running, most atomic.Int32
}

func (s *slowSet) AddWorker(ref events.WorkerRef, reg *fleetv1.Registration) (KeyedSink, error) {
	k, err := s.replicaSet.AddWorker(ref, reg)
	if err != nil {
		return nil, err
	}
	return &slowSink{KeyedSink: k, set: s}, nil
}

type slowSink struct {
	KeyedSink
	set *slowSet
}

func (k *slowSink) Restore(next func() ([]byte, error)) error {
	n := k.set.running.Add(1)
	defer k.set.running.Add(-1)
	for {
		m := k.set.most.Load()
		if n <= m || k.set.most.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(5 * time.Millisecond)
	return k.KeyedSink.Restore(next)
}

// TestSnapshotLoadsAreBounded: a replica discovering many workers at once
// loads at most SnapshotConcurrency snapshots at a time, and syncs them
// all, snapshots of many chunks included; then SourceOptions.Applied sees
// each applied delta's header.
func TestSnapshotLoadsAreBounded(t *testing.T) {
	s := runServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const pods, keys = 12, 40
	locals := make([]*setModel, pods)
	agents := make([]*Agent, pods)
	for i := range pods {
		locals[i] = newSetModel()
		for k := range keys {
			locals[i].refs[uint64(i*1000+k)] = [events.NumMedia]uint8{1}
		}
		// Chunks of about 64 bytes: several segments (one per key here)
		// each, a snapshot of many chunks.
		a, err := NewAgent(ctx, connect(t, s), AgentOptions{Model: "m", BlockSize: 16, Pod: fmt.Sprintf("p%d", i), ChunkBytes: 64}, map[int]LocalWorker{0: locals[i]})
		if err != nil {
			t.Fatal(err)
		}
		agents[i] = a
		go a.Run(ctx)
	}
	type applied struct {
		ref events.WorkerRef
		d   AppliedDelta
	}
	var mu sync.Mutex
	var seen []applied
	set := &slowSet{replicaSet: replicaSet{workers: map[events.WorkerRef]*setModel{}}}
	src := NewSource(connect(t, s), set, SourceOptions{SnapshotConcurrency: 2, Applied: func(ref events.WorkerRef, d AppliedDelta) {
		mu.Lock()
		seen = append(seen, applied{ref, d})
		mu.Unlock()
	}})
	go func() { _ = src.Run(ctx) }()
	waitFor(t, "every worker in sync", func() bool {
		for i := range pods {
			ref := events.WorkerRef{Pod: fmt.Sprintf("p%d", i)}
			w := set.worker(ref)
			if w == nil || len(w.keys()) != keys || src.Health(ref) == nil || src.Health(ref).Load() != events.HealthOK {
				return false
			}
		}
		return true
	})
	if n := set.most.Load(); n > 2 || n < 1 {
		t.Fatalf("%d snapshots loaded at once, want at most 2", n)
	}
	for i := range pods {
		want := locals[i].keys()
		if got := set.worker(events.WorkerRef{Pod: fmt.Sprintf("p%d", i)}).keys(); !slices.Equal(got, want) {
			t.Fatalf("worker %d holds %v, want %v", i, got, want)
		}
	}
	err := agents[3].Publish(0, 77, 1764400000.25, func(_ uint64, d *events.Delta) error {
		d.Entries = append(d.Entries, events.DeltaEntry{Op: events.DeltaStore, Key: 99}, events.DeltaEntry{Op: events.DeltaStore, Key: 98})
		return locals[3].ApplyDelta(0, d)
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the delta applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0
	})
	mu.Lock()
	defer mu.Unlock()
	want := applied{events.WorkerRef{Pod: "p3"}, AppliedDelta{Seq: 1, EngineSeq: 77, EngineTime: 1764400000.25, Entries: 2}}
	if len(seen) != 1 || seen[0] != want {
		t.Fatalf("Applied saw %+v, want %+v", seen, want)
	}
}
