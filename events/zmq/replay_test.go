package zmq_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// slowReplay is a replay ROUTER that answers every request with just the
// end marker after delay (or never, with delay < 0), and records how many
// requests it got and how many were outstanding at once.
type slowReplay struct {
	requests, maxOutstanding atomic.Int64
}

func (s *slowReplay) serve(ctx context.Context, t *testing.T, endpoint string, delay time.Duration) {
	zctx, _ := zmq4.NewContext()
	sock, err := zctx.NewSocket(zmq4.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	sock.SetLinger(0)
	if err := sock.Bind(endpoint); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer zctx.Term()
		defer sock.Close()
		type pending struct {
			id  []byte
			due time.Time
		}
		var out []pending
		poller := zmq4.NewPoller()
		poller.Add(sock, zmq4.POLLIN)
		for ctx.Err() == nil {
			polled, _ := poller.Poll(5 * time.Millisecond)
			if len(polled) > 0 {
				frames, err := sock.RecvMessageBytes(0)
				if err == nil && len(frames) == 3 {
					s.requests.Add(1)
					out = append(out, pending{id: frames[0], due: time.Now().Add(delay)})
					s.maxOutstanding.Store(max(s.maxOutstanding.Load(), int64(len(out))))
				}
			}
			if delay < 0 {
				continue
			}
			for len(out) > 0 && time.Now().After(out[0].due) {
				sock.SendMessage(out[0].id, []byte{}, []byte{}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte{})
				out = out[1:]
			}
		}
	}()
}

// newWorker returns a fresh index worker (the real events.Sink).
func newWorker(t *testing.T, ix *indexer.Index, pod string) *indexer.Worker {
	t.Helper()
	if _, err := ix.AddModel("m", 16); err != nil {
		t.Fatal(err)
	}
	w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: pod}, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func statsOf(s *zmq.Subscriber, pod string) events.WorkerStats {
	for _, st := range s.WorkerStats() {
		if st.Worker.Pod == pod {
			return st
		}
	}
	return events.WorkerStats{}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestReplayBacksOffAfterFailure: a replay endpoint that never answers
// costs one request (with no ReplayRetries; TestFailedReplayIsAskedAgain
// has them); the gaps that follow during the backoff go straight to the
// gap policy instead of a storm of replays.
func TestReplayBacksOffAfterFailure(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	replayEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	var rs slowReplay
	rs.serve(ctx, t, replayEP, -1)
	pubEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: pubEP, Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ix := indexer.New(indexer.Config{})
	w := newWorker(t, ix, "a")
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{ReplayTimeout: 200 * time.Millisecond, ReplayBackoff: 5 * time.Second, ReplayRetries: -1},
		zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: pubEP, ReplayEndpoint: replayEP, Sink: w})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	if err := pub.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// The join replay fails after 200 ms.
	waitFor(t, "the join replay to fail", func() bool { return statsOf(sub, "a").ReplayFailures == 1 })
	batch := &events.Batch{Events: []events.Event{{Kind: events.KindAllBlocksCleared}}}
	for i := 0; i < 5; i++ {
		pub.SetSeq(uint64(10 * (i + 1))) // a gap before every message
		if _, err := pub.Publish(batch); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the five messages", func() bool { return statsOf(sub, "a").LastSeq == 50 })
	st := statsOf(sub, "a")
	if rs.requests.Load() != 1 || st.Replays != 1 || st.Gaps != 4 || st.UnrecoveredGaps != 4 || st.JoinedAtSeq != 10 {
		t.Fatalf("replay requests %d, stats %+v", rs.requests.Load(), st)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestReplayConcurrencyIsBounded: six workers joining at once ask for
// their replays at most ReplayConcurrency at a time.
func TestReplayConcurrencyIsBounded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	replayEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	var rs slowReplay
	rs.serve(ctx, t, replayEP, 150*time.Millisecond)
	ix := indexer.New(indexer.Config{})
	var eps []zmq.Endpoint
	for i := 0; i < 6; i++ {
		pod := fmt.Sprintf("p%d", i)
		w := newWorker(t, ix, pod)
		// An engine on each endpoint, so that every SUB connects and joins.
		ep := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
		pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: ep, Bind: true})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		eps = append(eps, zmq.Endpoint{Worker: events.WorkerRef{Pod: pod}, Address: ep, ReplayEndpoint: replayEP, Sink: w})
	}
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{ReplayConcurrency: 2}, eps...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	waitFor(t, "six join replays", func() bool {
		for _, st := range sub.WorkerStats() {
			if st.Replays < 1 || st.Health == events.HealthRecovering {
				return false
			}
		}
		return rs.requests.Load() >= 6
	})
	if m := rs.maxOutstanding.Load(); m > 2 {
		t.Fatalf("%d replays outstanding at once, want <= 2", m)
	}
	cancel()
	<-done
}
