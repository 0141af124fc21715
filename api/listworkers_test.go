package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// fakeStats is a fixed events.StatsSource.
type fakeStats []events.WorkerStats

func (f fakeStats) WorkerStats() []events.WorkerStats { return f }

func TestListWorkers(t *testing.T) {
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	mustModel(t, ix, "m2")
	b := mustWorker(t, ix, "m", "pod-b", 0)
	a := mustWorker(t, ix, "m", "pod-a", 1)
	c := mustWorker(t, ix, "m2", "pod-c", 0)

	p := prompt(1, 8)
	apply(t, a, stored(100, p, 0, 8))
	apply(t, a, events.Event{Kind: events.KindBlockStored, BlockHashes: hashes(100, 0, 3), Medium: events.MediumCPU})
	apply(t, a, removed(100, 6, 8, events.MediumGPU))
	// Problems are counted, not fatal: an orphan, an unknown removal and a
	// store describing the group anew (32-token blocks).
	orphan := stored(200, p, 4, 5)
	_ = a.ApplyBatch(&events.Batch{Events: []events.Event{orphan}})
	_ = a.ApplyBatch(&events.Batch{Events: []events.Event{removed(300, 0, 2, events.MediumGPU)}})
	bad := stored(400, p, 0, 2)
	bad.BlockSize, bad.BlockHashes = 32, bad.BlockHashes[:1]
	_ = a.ApplyBatch(&events.Batch{Events: []events.Event{bad}})
	apply(t, b, stored(500, p, 0, 2), events.Event{Kind: events.KindAllBlocksCleared})
	apply(t, c, stored(600, p, 0, 1))

	seen := time.Date(2026, 11, 29, 7, 0, 0, 0, time.UTC)
	stats := fakeStats{
		{
			Worker: events.WorkerRef{Pod: "pod-a", DPRank: 1}, Endpoint: "tcp://10.0.0.1:5557", Topic: "kv@pod-a",
			Batches: 7, Events: 9, LastSeq: 41, HasSeq: true, LastMessage: seen,
			Gaps: 1, MissedBatches: 3, Restarts: 2, DecodeErrors: 4, ApplyErrors: 3, LastError: "boom",
			UnknownEvents: 2, UnknownTag: "FutureEvent", UnknownMediumEvents: 5, UnknownMedia: []string{"ZZZ_TIER", "bad\xff"},
		},
		{Worker: events.WorkerRef{Pod: "ghost", DPRank: 0}, Endpoint: "tcp://ghost:5557", DecodeErrors: 1},
	}
	f := serve(t, ix, stats, api.Options{})

	resp, err := f.client.ListWorkers(context.Background(), &kvindexv1.ListWorkersRequest{})
	if err != nil {
		t.Fatalf("ListWorkers: %v", err)
	}
	var pods []string
	for _, w := range resp.GetWorkers() {
		pods = append(pods, w.GetWorker().GetPod())
	}
	if got := strings.Join(pods, ","); got != "ghost,pod-a,pod-b,pod-c" {
		t.Fatalf("workers %s, want ghost,pod-a,pod-b,pod-c (sorted)", got)
	}

	gotA := resp.GetWorkers()[1]
	if gotA.GetLastEventTime().AsTime() != seen {
		t.Errorf("pod-a last event %v, want %v", gotA.GetLastEventTime().AsTime(), seen)
	}
	wantA := &kvindexv1.WorkerStatus{
		Worker: ref("pod-a", 1), Model: "m", Endpoint: "tcp://10.0.0.1:5557", Topic: "kv@pod-a",
		LastSeq: 41, HasSeq: true, LastEventTime: timestamppb.New(seen), Batches: 7, Events: 9,
		// 6 of the 8 blocks stay resident (2 evicted), plus 1 orphan.
		ResidentBlocks: 7,
		ResidentByMedium: []*kvindexv1.MediumCount{
			{Medium: "GPU", Blocks: 7},
			{Medium: "CPU", Blocks: 3},
		},
		BlocksStored: 9, BlocksRemoved: 2,
		Gaps: 1, MissedBatches: 3, Restarts: 2, DecodeErrors: 4, ApplyErrors: 3,
		Orphans: 1, UnknownBlocks: 2, LayoutChanges: 1, LastError: "boom",
		BlockSize: 16, ModelBlockSize: 16,
		Groups: []*kvindexv1.KVCacheGroup{{Index: 0, Role: "prefix", BlockSize: 16, ResidentBlocks: 7}},
		// Unknown event types and media, names made UTF-8.
		UnknownEvents: 2, LastUnknownEvent: "FutureEvent", UnknownMediumEvents: 5, UnknownMedia: []string{"ZZZ_TIER", "bad\uFFFD"},
	}
	if !proto.Equal(gotA, wantA) {
		t.Errorf("pod-a\n got %s\nwant %s", protojson.Format(gotA), protojson.Format(wantA))
	}

	gotB := resp.GetWorkers()[2]
	if gotB.GetResidentBlocks() != 0 || gotB.GetBlocksStored() != 2 || gotB.GetClears() != 1 ||
		gotB.GetEndpoint() != "tcp://pod-b:5557" || gotB.GetHasSeq() || gotB.GetLastEventTime() == nil {
		t.Errorf("pod-b (index only, cleared): %s", protojson.Format(gotB))
	}
	ghost := resp.GetWorkers()[0]
	if ghost.GetModel() != "" || ghost.GetDecodeErrors() != 1 || ghost.GetEndpoint() != "tcp://ghost:5557" {
		t.Errorf("ghost (subscriber only): %s", protojson.Format(ghost))
	}

	resp, err = f.client.ListWorkers(context.Background(), &kvindexv1.ListWorkersRequest{Model: "m2"})
	if err != nil {
		t.Fatalf("ListWorkers(m2): %v", err)
	}
	if len(resp.GetWorkers()) != 1 || resp.GetWorkers()[0].GetWorker().GetPod() != "pod-c" || resp.GetWorkers()[0].GetResidentBlocks() != 1 {
		t.Errorf("ListWorkers(m2): %s", protojson.Format(resp))
	}

	_, err = f.client.ListWorkers(context.Background(), &kvindexv1.ListWorkersRequest{Model: "nope"})
	if st, _ := api.ServerStatus(err); status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(st.Message(), `model: unknown model "nope"`) {
		t.Errorf("ListWorkers(nope): %v", err)
	}
}

// applyingStats is a stats source that, as it is read, has a batch applied
// to w, as a stream may apply one just after the listing read its stats.
type applyingStats struct {
	t *testing.T
	w *indexer.Worker
	b []events.Event
}

func (s applyingStats) WorkerStats() []events.WorkerStats {
	out := []events.WorkerStats{{Worker: s.w.Info().Ref, Batches: 1, LastSeq: 0, HasSeq: true}}
	apply(s.t, s.w, s.b...)
	return out
}

// ListWorkers reads the streams' stats before the index's block counts: a
// stream shows a batch only once the index applied it, so whatever seq a
// listing shows, its blocks are counted (here the listing also counts a
// batch applied just after the stats were read: 3 blocks, not 0).
func TestListWorkersReadsStreamsFirst(t *testing.T) {
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	w := mustWorker(t, ix, "m", "pod-a", 0)
	f := serve(t, ix, applyingStats{t: t, w: w, b: []events.Event{stored(100, prompt(1, 3), 0, 3)}}, api.Options{})
	resp, err := f.client.ListWorkers(context.Background(), &kvindexv1.ListWorkersRequest{})
	if err != nil {
		t.Fatalf("ListWorkers: %v", err)
	}
	if len(resp.GetWorkers()) != 1 {
		t.Fatalf("%d workers, want 1", len(resp.GetWorkers()))
	}
	if got := resp.GetWorkers()[0]; !got.GetHasSeq() || got.GetLastSeq() != 0 || got.GetResidentBlocks() != 3 {
		t.Fatalf("pod-a: last_seq %d (has %v), %d resident blocks; want 0 (true), 3", got.GetLastSeq(), got.GetHasSeq(), got.GetResidentBlocks())
	}
}
