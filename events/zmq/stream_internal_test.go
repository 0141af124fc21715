package zmq

import (
	"context"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// recordingSink counts what reaches it.
type recordingSink struct {
	batches, resets int
}

func (r *recordingSink) ApplyBatch(*events.Batch) error { r.batches++; return nil }
func (r *recordingSink) Reset(string)                   { r.resets++ }

// A replay given up as too slow can still answer later. Its answer must not
// be taken for the answer of a later recovery, even one from the same seq:
// the stream accepts only its current replay generation, and counts the
// stale one.
func TestStaleReplayResultIsDropped(t *testing.T) {
	sink := &recordingSink{}
	s, err := NewSubscriber(SubscriberOptions{}, Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://127.0.0.1:2", Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	st := s.streams[0]
	ctx := context.Background()
	payload, err := events.AppendPayload(nil, &events.Batch{Events: []events.Event{{Kind: events.KindAllBlocksCleared}}}, events.EncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	answer := []replayedBatch{{seq: 0, payload: payload}, {seq: 1, payload: payload}}

	// Recovery 1 from seq 0 was abandoned; recovery 2, also from seq 0, runs.
	st.replayGen, st.recovering, st.recoverFrom = 2, true, 0
	st.onReplay(ctx, replayResult{gen: 1, from: 0, batches: answer})
	if sink.batches != 0 || !st.recovering {
		t.Fatalf("stale answer applied: %d batches, recovering=%v", sink.batches, st.recovering)
	}
	if got := st.snapshot(); got.StaleReplays != 1 || got.ApplyErrors != 1 {
		t.Fatalf("stale answer not counted: StaleReplays=%d ApplyErrors=%d", got.StaleReplays, got.ApplyErrors)
	}
	// The current recovery's answer applies.
	st.onReplay(ctx, replayResult{gen: 2, from: 0, batches: answer})
	if sink.batches != 2 || st.recovering || st.expected != 2 {
		t.Fatalf("current answer: %d batches applied, recovering=%v, expected seq %d; want 2, false, 2", sink.batches, st.recovering, st.expected)
	}
	// An answer after recovery ended is stale too.
	st.onReplay(ctx, replayResult{gen: 2, from: 0, batches: answer})
	if sink.batches != 2 || st.snapshot().StaleReplays != 2 {
		t.Fatalf("late duplicate answer: %d batches, StaleReplays=%d", sink.batches, st.snapshot().StaleReplays)
	}
}

// A worker's queue is bounded in payload bytes as well as in batches: past
// QueueBytes a message is dropped and counted, whatever room the channel
// has, and the bytes of dequeued messages are freed.
func TestQueueBytesBound(t *testing.T) {
	s, err := NewSubscriber(SubscriberOptions{QueueBytes: 100}, Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: "tcp://127.0.0.1:1", Sink: &recordingSink{}})
	if err != nil {
		t.Fatal(err)
	}
	st := s.streams[0]
	st.enqueue(message{seq: 0, size: 60})
	st.enqueue(message{seq: 1, size: 60}) // 120 > 100: dropped
	st.enqueue(message{seq: 2, size: 40}) // 100: fits
	if got := st.snapshot(); got.Dropped != 1 || got.Backlog != 2 || st.queued.Load() != 100 {
		t.Fatalf("dropped %d, backlog %d, queued %d bytes; want 1, 2, 100", got.Dropped, got.Backlog, st.queued.Load())
	}
}
