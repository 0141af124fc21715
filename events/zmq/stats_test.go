package zmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// gatedSink is an index worker whose every batch waits in ApplyBatchAt
// until the test lets it through: entered gets the batch's seq, then the
// batch waits for release before the worker applies it.
type gatedSink struct {
	w       *indexer.Worker
	entered chan uint64
	release chan struct{}
}

func (g *gatedSink) ApplyBatch(*events.Batch) error { panic("ApplyBatchAt expected") }
func (g *gatedSink) Reset(reason string)            { g.w.Reset(reason) }
func (g *gatedSink) ApplyBatchAt(seq uint64, b *events.Batch) error {
	g.entered <- seq
	<-g.release
	return g.w.ApplyBatch(b)
}

// next waits for the sink to hold the batch of seq want.
func (g *gatedSink) next(t *testing.T, want uint64) {
	t.Helper()
	select {
	case seq := <-g.entered:
		if seq != want {
			t.Fatalf("the sink got seq %d, want %d", seq, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for the sink to get seq %d", want)
	}
}

// A worker's stats count a batch, and show its seq, only once its sink
// has applied it: while the sink holds a batch, live or replayed, the
// stats still show the one before; once they show its seq, its blocks
// are in the index.
func TestStatsFollowAppliedBatches(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pubEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	replayEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: pubEP, Bind: true, ReplayEndpoint: replayEP})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ix := indexer.New(indexer.Config{})
	g := &gatedSink{w: newWorker(t, ix, "a"), entered: make(chan uint64, 16), release: make(chan struct{})}
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{}, zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: pubEP, ReplayEndpoint: replayEP, Sink: g})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() {
		cancel()
		close(g.release) // a batch the sink still holds goes through
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if err := pub.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// The join replay finds nothing; wait for it so that seq 0 arrives live.
	waitFor(t, "the join replay", func() bool {
		st := statsOf(sub, "a")
		return st.Replays >= 1 && st.Health != events.HealthRecovering
	})

	// check asserts the stats while the sink holds a batch.
	check := func(what string, hasSeq bool, lastSeq uint64, batches, replayed, resident int64) {
		t.Helper()
		st := statsOf(sub, "a")
		if st.HasSeq != hasSeq || st.HasSeq && st.LastSeq != lastSeq || st.Batches != batches || st.ReplayedBatches != replayed {
			t.Fatalf("%s: stats show seq %d (has %v), %d batches, %d replayed; want seq %d (has %v), %d, %d", what, st.LastSeq, st.HasSeq, st.Batches, st.ReplayedBatches, lastSeq, hasSeq, batches, replayed)
		}
		if got := g.w.Stats().ResidentBlocks; got != resident {
			t.Fatalf("%s: %d resident blocks, want %d", what, got, resident)
		}
	}
	// pass lets the held batch through and waits for the stats to show
	// seq; by then its blocks must be in the index.
	pass := func(seq uint64, resident int64) {
		t.Helper()
		g.release <- struct{}{}
		waitFor(t, fmt.Sprintf("seq %d in the stats", seq), func() bool {
			st := statsOf(sub, "a")
			return st.HasSeq && st.LastSeq == seq
		})
		if got := g.w.Stats().ResidentBlocks; got != resident {
			t.Fatalf("the stats show seq %d with %d resident blocks, want %d", seq, got, resident)
		}
	}

	if _, err := pub.Publish(chainBatch(0)); err != nil { // seq 0, live
		t.Fatal(err)
	}
	g.next(t, 0)
	check("seq 0 held", false, 0, 0, 0, 0)
	pass(0, bigBlocks)

	if _, err := pub.PublishLost(chainBatch(1)); err != nil { // seq 1: lost, then replayed
		t.Fatal(err)
	}
	if _, err := pub.Publish(chainBatch(2)); err != nil { // seq 2 shows the gap
		t.Fatal(err)
	}
	g.next(t, 1)
	check("replayed seq 1 held", true, 0, 1, 0, bigBlocks)
	pass(1, 2*bigBlocks)
	g.next(t, 2)
	check("seq 2 held after the replay", true, 1, 2, 1, 2*bigBlocks)
	pass(2, 3*bigBlocks)
	if st := statsOf(sub, "a"); st.Batches != 3 || st.ReplayedBatches != 1 || st.Gaps != 1 || st.UnrecoveredGaps != 0 || st.Events != 3 {
		t.Fatalf("final stats: %d batches, %d replayed, %d gaps (%d unrecovered), %d events; want 3, 1, 1 (0), 3", st.Batches, st.ReplayedBatches, st.Gaps, st.UnrecoveredGaps, st.Events)
	}
}
