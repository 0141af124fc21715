package zmq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/indexer"
)

// TestAddRemoveEndpointWhileRunning: an engine added to a running
// subscriber is subscribed to (its buffered history replayed on join, then
// live batches applied); once removed, nothing more reaches its worker, it
// leaves WorkerStats and Health, and it can be added again.
func TestAddRemoveEndpointWhileRunning(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ix := indexer.New(indexer.Config{WorkerCapacity: -1})
	wa := newWorker(t, ix, "a")
	pubA, epA, repA := bigPublisher(t)
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{}, zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: epA, ReplayEndpoint: repA, Sink: wa})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	if err := pubA.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}

	if err := sub.AddEndpoint(zmq.Endpoint{Worker: events.WorkerRef{Pod: "bad"}, Address: "nonsense://x", Sink: wa}); err == nil || sub.IsPullPod("bad") || sub.Health(events.WorkerRef{Pod: "bad"}) != nil {
		t.Fatalf("an endpoint that cannot connect: err %v, left behind as a pull pod: %v", err, sub.IsPullPod("bad"))
	}
	pubB, epB, repB := bigPublisher(t)
	if _, err := pubB.Publish(chainBatch(0)); err != nil { // before kvindex knows of b
		t.Fatal(err)
	}
	wb := newWorker(t, ix, "b")
	refB := events.WorkerRef{Pod: "b"}
	if err := sub.AddEndpoint(zmq.Endpoint{Worker: refB, Address: epB, ReplayEndpoint: repB, Sink: wb}); err != nil {
		t.Fatal(err)
	}
	if err := sub.AddEndpoint(zmq.Endpoint{Worker: refB, Address: epB, Sink: wb}); err == nil {
		t.Fatal("the same worker added twice: no error")
	}
	if err := pubB.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b's history replayed on join", func() bool { return wb.Stats().ResidentBlocks == bigBlocks })
	if _, err := pubB.Publish(chainBatch(1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b's live batch", func() bool { return wb.Stats().ResidentBlocks == 2*bigBlocks })
	if sub.Health(refB) == nil {
		t.Fatal("added worker has no health cell")
	}

	if err := sub.RemoveEndpoint(refB); err != nil {
		t.Fatal(err)
	}
	if err := sub.RemoveEndpoint(refB); !errors.Is(err, zmq.ErrUnknownEndpoint) {
		t.Fatalf("second removal: %v, want ErrUnknownEndpoint", err)
	}
	if sub.Health(refB) != nil {
		t.Fatal("removed worker still has a health cell")
	}
	for _, st := range sub.WorkerStats() {
		if st.Worker == refB {
			t.Fatalf("removed worker still in WorkerStats: %+v", st)
		}
	}
	// Nothing more is applied: the removal closed the socket, so the
	// publisher loses its subscriber, and its next batch changes nothing.
	if _, err := pubB.Publish(chainBatch(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := pubA.Publish(chainBatch(3)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's batch (so b's would have arrived too)", func() bool { return wa.Stats().ResidentBlocks == bigBlocks })
	if got := wb.Stats().ResidentBlocks; got != 2*bigBlocks {
		t.Fatalf("removed worker holds %d blocks, want %d (nothing applied after removal)", got, 2*bigBlocks)
	}
	// An endpoint given to NewSubscriber is removed the same way.
	if err := sub.RemoveEndpoint(events.WorkerRef{Pod: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pubA.Publish(chainBatch(4)); err != nil {
		t.Fatal(err)
	}
	if sub.Health(events.WorkerRef{Pod: "a"}) != nil {
		t.Fatal("removed configured worker still has a health cell")
	}

	// Added again (a new worker, as discovery does): it rejoins from replay.
	if err := ix.RemoveWorker(refB); err != nil {
		t.Fatal(err)
	}
	wb2 := newWorker(t, ix, "b")
	if err := sub.AddEndpoint(zmq.Endpoint{Worker: refB, Address: epB, ReplayEndpoint: repB, Sink: wb2}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b re-added learns all three batches", func() bool { return wb2.Stats().ResidentBlocks == 3*bigBlocks })
	if got := wa.Stats().ResidentBlocks; got != bigBlocks {
		t.Fatalf("removed configured worker holds %d blocks, want %d", got, bigBlocks)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := sub.AddEndpoint(zmq.Endpoint{Worker: events.WorkerRef{Pod: "c"}, Address: epB, Sink: wb2}); !errors.Is(err, zmq.ErrStopped) {
		t.Fatalf("add after Run: %v, want ErrStopped", err)
	}
}

// TestAddRemoveEndpointBeforeRun: before Run, AddEndpoint and
// RemoveEndpoint only change what Run will subscribe to.
func TestAddRemoveEndpointBeforeRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ix := indexer.New(indexer.Config{WorkerCapacity: -1})
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, pod := range []string{"x", "y"} {
		pub, ep, rep := bigPublisher(t)
		if _, err := pub.Publish(chainBatch(i)); err != nil {
			t.Fatal(err)
		}
		if err := sub.AddEndpoint(zmq.Endpoint{Worker: events.WorkerRef{Pod: pod}, Address: ep, ReplayEndpoint: rep, Sink: newWorker(t, ix, pod)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sub.RemoveEndpoint(events.WorkerRef{Pod: "y"}); err != nil {
		t.Fatal(err)
	}
	if err := sub.AddEndpoint(zmq.Endpoint{Worker: events.WorkerRef{Pod: "z"}}); err == nil {
		t.Fatal("endpoint without address or sink: no error")
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	x := ix.LookupWorker(events.WorkerRef{Pod: "x"})
	waitFor(t, "x learns its history", func() bool { return x.Stats().ResidentBlocks == bigBlocks })
	if got := len(sub.WorkerStats()); got != 1 {
		t.Fatalf("%d workers subscribed, want 1 (y removed before Run)", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestAddEndpointFences: an added pull-mode pod is fenced off push
// listeners like a configured one, and a pod a push listener claimed or
// routes cannot be added as a pull-mode endpoint.
func TestAddEndpointFences(t *testing.T) {
	ix := indexer.New(indexer.Config{WorkerCapacity: -1})
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{
		Push:      []zmq.PushListener{{Address: "tcp://127.0.0.1:1", Routes: map[string]events.TopicRoute{"t": {Pod: "routed", Model: "m"}}}},
		NewWorker: func(events.WorkerRef, string, string) (events.Sink, error) { return nil, errors.New("unused") },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.AddEndpoint(zmq.Endpoint{Worker: events.WorkerRef{Pod: "routed"}, Address: "tcp://127.0.0.1:2", Sink: newWorker(t, ix, "routed")}); err == nil {
		t.Fatal("a routed push pod added as a pull-mode endpoint")
	}
	if err := sub.AddEndpoint(zmq.Endpoint{Worker: events.WorkerRef{Pod: "p", DPRank: 1}, Address: "tcp://127.0.0.1:3", Sink: newWorker(t, ix, "p")}); err != nil {
		t.Fatal(err)
	}
	if !sub.IsPullPod("p") {
		t.Fatal("added pod not fenced as pull-mode")
	}
	if err := sub.RemoveEndpoint(events.WorkerRef{Pod: "p", DPRank: 1}); err != nil {
		t.Fatal(err)
	}
	if sub.IsPullPod("p") {
		t.Fatal("removed pod still fenced as pull-mode")
	}
}
