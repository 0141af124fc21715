package soak

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/netutil"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// The transport's behaviours the soak found wanting, as tests over real
// ZeroMQ against the subscriber alone (docs/reliability.md).

// loopbacks returns n distinct free loopback endpoints (separate calls
// for one port each could be handed the same port twice).
func loopbacks(t *testing.T, n int) []string {
	t.Helper()
	p, err := netutil.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("tcp://127.0.0.1:%d", p+i)
	}
	return out
}

// waitSubscribed waits, at most 10 s, for pub's first subscriber, failing
// with the subscriber's own error when its Run (reporting to done) ended
// first: a subscriber that cannot bind or connect must not hang the test.
func waitSubscribed(ctx context.Context, t *testing.T, pub *enginepub.Publisher, done chan error) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := pub.WaitForSubscribers(wctx, 1)
	if err == nil {
		return
	}
	select {
	case runErr := <-done:
		done <- runErr // for the deferred wait on Run
		t.Fatalf("%v; the subscriber's Run returned %v", err, runErr)
	default:
		t.Fatal(err)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// fakeReplay is an engine's replay ROUTER that answers each request from
// seq start with the seqs answer gives (empty batches), then the end
// marker, as vLLM does, and records the starts asked.
type fakeReplay struct {
	mu     sync.Mutex
	starts []uint64
}

func (f *fakeReplay) serve(ctx context.Context, t *testing.T, endpoint string, answer func(start uint64) []uint64) {
	t.Helper()
	zctx, err := zmq4.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	router, err := zctx.NewSocket(zmq4.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	_ = router.SetLinger(0)
	_ = router.SetRcvtimeo(20 * time.Millisecond)
	if err := router.Bind(endpoint); err != nil {
		t.Fatal(err)
	}
	payload, err := events.AppendPayload(nil, &events.Batch{Timestamp: 1}, events.EncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { <-done; router.Close(); zctx.Term() })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fr, err := router.RecvMessageBytes(0)
			if err != nil || len(fr) != 3 || len(fr[2]) != 8 {
				continue
			}
			start := binary.BigEndian.Uint64(fr[2])
			f.mu.Lock()
			f.starts = append(f.starts, start)
			f.mu.Unlock()
			var seq [8]byte
			for _, s := range answer(start) {
				binary.BigEndian.PutUint64(seq[:], s)
				_, _ = router.SendMessage(fr[0], []byte{}, "t", seq[:], payload)
			}
			_, _ = router.SendMessage(fr[0], []byte{}, []byte{}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte{})
		}
	}()
}

func (f *fakeReplay) asked() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint64(nil), f.starts...)
}

// A replay answer that lost messages at the engine's send limit and then
// delivered seqs past the first live message held is asked again, not
// taken for a loss: with the gap 1..19 and live seq 20 held, neither
// 1..5, 25 (6..19 still buffered) nor 1..19, 25 (nothing missing) may
// reset the worker.
func TestReplayAnswerPastTheLiveSeq(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(start uint64) []uint64
	}{
		{"hole before the live seq", func(start uint64) []uint64 {
			if start == 1 {
				return []uint64{1, 2, 3, 4, 5, 25}
			}
			var out []uint64
			for s := max(start, 1); s < 20 && start > 0; s++ {
				out = append(out, s)
			}
			return out
		}},
		{"hole after the live seq", func(start uint64) []uint64 {
			if start == 1 {
				return []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 25}
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			eps := loopbacks(t, 2)
			pubEP, replayEP := eps[0], eps[1]
			pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: pubEP, Bind: true, Topic: "t"})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			var fake fakeReplay
			fake.serve(ctx, t, replayEP, tc.answer)
			ix := indexer.New(indexer.Config{})
			if _, err := ix.AddModel("m", 16); err != nil {
				t.Fatal(err)
			}
			w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "a"}, Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{}, zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: pubEP, ReplayEndpoint: replayEP, Sink: w})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx) }()
			defer func() { cancel(); <-done }()
			waitSubscribed(ctx, t, pub, done)
			// The join and its second ask a second later find nothing.
			waitUntil(t, "the join replays", func() bool { return len(fake.asked()) >= 2 })
			stats := func() events.WorkerStats { return sub.WorkerStats()[0] }
			if _, err := pub.Publish(&events.Batch{Timestamp: 1}); err != nil { // seq 0
				t.Fatal(err)
			}
			waitUntil(t, "seq 0", func() bool { return stats().HasSeq })
			pub.SetSeq(20)
			if _, err := pub.Publish(&events.Batch{Timestamp: 1}); err != nil { // seq 20: 1..19 lost
				t.Fatal(err)
			}
			waitUntil(t, "seq 20", func() bool {
				st := stats()
				return st.LastSeq == 20 && st.HasSeq && st.Health != events.HealthRecovering
			})
			if st := stats(); st.UnrecoveredGaps != 0 || w.Stats().Resets != 0 {
				t.Fatalf("replays asked from %v; unrecovered gaps %d, resets %d (%q): the engine still buffered every lost seq", fake.asked(), st.UnrecoveredGaps, w.Stats().Resets, w.Stats().LastReset)
			}
		})
	}
}

// A push message can create no worker under a pull pod's name, whatever
// rank it names, and no listener can claim a pod another listener routes:
// the routed engine, sending after the squatter, owns its name.
func TestPushFence(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	eps := loopbacks(t, 3)
	pullEP, open, routed := eps[0], eps[1], eps[2]
	pull, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: pullEP, Bind: true, Topic: "kv@a@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pull.Close()
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel("m", 16); err != nil {
		t.Fatal(err)
	}
	a, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "a"}, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{
		Push: []zmq.PushListener{{Address: open}, {Address: routed, Routes: map[string]events.TopicRoute{"engine-p": {Pod: "p", Model: "m"}}}},
		NewWorker: func(ref events.WorkerRef, model, _ string) (events.Sink, error) {
			return ix.AddWorker(indexer.WorkerInfo{Ref: ref, Model: model, Endpoint: "push"})
		},
	}, zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: pullEP, Sink: a})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitSubscribed(ctx, t, pull, done)
	batch := func(rank int) *events.Batch {
		return &events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{5}, TokenIDs: make([]uint32, 16), BlockSize: 16}}, DPRank: rank, HasDPRank: true}
	}
	refused := func(listener, reason string) int64 {
		for _, r := range sub.Refusals() {
			if r.Source == listener && r.Reason == reason {
				return r.Count
			}
		}
		return 0
	}
	send := func(endpoint, topic string, rank int, until func() bool) {
		t.Helper()
		p, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: endpoint, Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		waitSubscribed(ctx, t, p, done)
		if _, err := p.Publish(batch(rank)); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, fmt.Sprintf("%s at rank %d on %s", topic, rank, endpoint), until)
	}
	send(open, "kv@a@m", 1, func() bool { return refused(open, "pull_worker") == 1 }) // pull pod a has rank 0 only
	send(open, "kv@p@m", 0, func() bool { return refused(open, "other_listener") == 1 })
	send(routed, "engine-p", 0, func() bool {
		w := ix.LookupWorker(events.WorkerRef{Pod: "p"})
		return w != nil && w.Stats().ResidentBlocks == 1
	})
	var refs []string
	for _, w := range ix.Workers() {
		refs = append(refs, w.Info().Ref.String())
	}
	slices.Sort(refs)
	if want := []string{"a/0", "p/0"}; !slices.Equal(refs, want) {
		t.Errorf("workers %v, want %v; refusals %v", refs, want, sub.Refusals())
	}
	if n := refused(routed, "other_listener"); n != 0 {
		t.Errorf("the routed engine was refused %d times (other_listener)", n)
	}
}
