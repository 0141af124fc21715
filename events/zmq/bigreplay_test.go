package zmq_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// bigBatches is how many batches the engine buffers in these tests: more
// than five times libzmq's default send high-water mark (1,000), which the
// publisher's replay ROUTER keeps, as vLLM's does. Each batch stores a new
// 16-block chain, so every lost batch shows in the resident count.
const bigBatches, bigBlocks = 6000, 16

func chainBatch(i int) *events.Batch {
	hs := make([]uint64, bigBlocks)
	toks := make([]uint32, bigBlocks*16)
	for j := range hs {
		hs[j] = uint64(i*bigBlocks + j + 1)
	}
	for j := range toks {
		toks[j] = uint32(i*7919 + j)
	}
	return &events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: hs, TokenIDs: toks, BlockSize: 16}}}
}

// bigPublisher is an engine whose replay socket keeps libzmq's default send
// limit.
func bigPublisher(t *testing.T) (pub *enginepub.Publisher, pubEP, replayEP string) {
	t.Helper()
	pubEP = fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	replayEP = fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: pubEP, Bind: true, ReplayEndpoint: replayEP, BufferSteps: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub, pubEP, replayEP
}

// checkWhole asserts the worker holds every block of n batches and was
// never reset for a loss.
func checkWhole(t *testing.T, sub *zmq.Subscriber, w *indexer.Worker, n int) {
	t.Helper()
	want := int64(n * bigBlocks)
	// Wait on progress, not on a fixed time: on a loaded machine recovering
	// 6,000 batches can take longer than any one deadline, but it must
	// never stall.
	last, stalled := int64(-1), time.Now().Add(10*time.Second)
	for got := w.Stats().ResidentBlocks; got != want; got = w.Stats().ResidentBlocks {
		if got != last {
			last, stalled = got, time.Now().Add(10*time.Second)
		} else if time.Now().After(stalled) {
			t.Fatalf("replay stalled at %d of %d blocks; stats %+v", got, want, statsOf(sub, "a"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	st := statsOf(sub, "a")
	if st.UnrecoveredGaps != 0 || w.Stats().Resets != 0 {
		t.Fatalf("holes called lost: %d unrecovered gaps, %d resets; stats %+v", st.UnrecoveredGaps, w.Stats().Resets, st)
	}
	if st.ReplayedBatches < int64(bigBatches-1) {
		t.Fatalf("replayed %d batches, want at least %d", st.ReplayedBatches, bigBatches-1)
	}
	t.Logf("%d replay requests, %d continued after a dropped tail", st.Replays, st.ReplayContinuations)
}

// TestReplayRecoversBeyondSendLimit: 6,000 batches lost on the way (as a
// full high-water mark loses them) are all recovered by replay, though
// the engine's ROUTER drops most of each answer: the contiguous part is
// applied and the rest asked for again from the first missing seq.
func TestReplayRecoversBeyondSendLimit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, pubEP, replayEP := bigPublisher(t)
	ix := indexer.New(indexer.Config{WorkerCapacity: -1})
	w := newWorker(t, ix, "a")
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{MaxPending: 20_000},
		zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: pubEP, ReplayEndpoint: replayEP, Sink: w})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	if err := pub.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(chainBatch(0)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first batch", func() bool {
		st := statsOf(sub, "a")
		return st.HasSeq && st.LastSeq == 0 && st.Health == events.HealthOK
	})
	for i := 1; i < bigBatches; i++ {
		if _, err := pub.PublishLost(chainBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.Publish(chainBatch(bigBatches)); err != nil { // reveals the gap
		t.Fatal(err)
	}
	checkWhole(t, sub, w, bigBatches+1)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestLateJoinRecoversBeyondSendLimit: kvindex starts after an engine has
// buffered 6,000 batches, and learns all of them.
func TestLateJoinRecoversBeyondSendLimit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, pubEP, replayEP := bigPublisher(t)
	for i := range bigBatches {
		if _, err := pub.Publish(chainBatch(i)); err != nil { // nobody subscribed yet
			t.Fatal(err)
		}
	}
	ix := indexer.New(indexer.Config{WorkerCapacity: -1})
	w := newWorker(t, ix, "a")
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{},
		zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: pubEP, ReplayEndpoint: replayEP, Sink: w})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	checkWhole(t, sub, w, bigBatches)
	if st := statsOf(sub, "a"); st.JoinedAtSeq != 0 {
		t.Fatalf("joined at seq %d, want 0 (the engine still buffered everything)", st.JoinedAtSeq)
	}
	// A live batch after the join continues the sequence.
	if _, err := pub.Publish(chainBatch(bigBatches)); err != nil {
		t.Fatal(err)
	}
	checkWhole(t, sub, w, bigBatches+1)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestJoinWaitsForTheEngine: kvindex starts before the engine. The engine
// sends its first batch before kvindex's SUB has connected (so the PUB
// drops it) and then stays idle. The join replay runs once the connection
// is up, finds the batch, and no spurious replay failure is reported for
// the time the engine was not there.
func TestJoinWaitsForTheEngine(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pubEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	replayEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	ix := indexer.New(indexer.Config{})
	w := newWorker(t, ix, "a")
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{ReplayTimeout: 300 * time.Millisecond},
		zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: pubEP, ReplayEndpoint: replayEP, Sink: w})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	time.Sleep(700 * time.Millisecond) // longer than a replay timeout: no engine yet
	pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: pubEP, Bind: true, ReplayEndpoint: replayEP})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if _, err := pub.Publish(chainBatch(0)); err != nil { // before the SUB reconnects
		t.Fatal(err)
	}
	waitFor(t, "the first batch, through the join replay", func() bool { return w.Stats().ResidentBlocks == bigBlocks })
	if st := statsOf(sub, "a"); st.ReplayFailures != 0 || st.UnrecoveredGaps != 0 || st.LastSeq != 0 || !st.HasSeq {
		t.Fatalf("stats %+v: want the batch at seq 0 with no replay failure", st)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestMaxMessageBytes: a message over the limit never reaches the decoder
// (libzmq drops the connection that sent it, and the engine's replay
// cannot hand it over either), the loss is handled by the gap policy, and
// the messages around it apply.
func TestMaxMessageBytes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, pubEP, replayEP := bigPublisher(t)
	ix := indexer.New(indexer.Config{})
	w := newWorker(t, ix, "a")
	// The replay cannot hand the oversized batch over either: asking again
	// (ReplayRetries) would only make the loss later.
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{MaxMessageBytes: 32 << 10, GapPolicy: events.GapKeep, ReconnectInterval: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond, ReplayRetries: -1},
		zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: pubEP, ReplayEndpoint: replayEP, Sink: w})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	if err := pub.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(chainBatch(0)); err != nil { // ~1.3 KB
		t.Fatal(err)
	}
	waitFor(t, "the first batch", func() bool { return w.Stats().ResidentBlocks == bigBlocks })
	huge := &events.Batch{}
	for i := 1; i <= 40; i++ { // ~50 KB: over the 32 KB limit
		huge.Events = append(huge.Events, chainBatch(i).Events...)
	}
	if _, err := pub.Publish(huge); err != nil {
		t.Fatal(err)
	}
	// The engine keeps publishing; the SUB reconnects and the next batch
	// reveals the gap, which replay cannot fill.
	waitFor(t, "the next batch after the oversized one", func() bool {
		if _, err := pub.Publish(chainBatch(100)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		st := statsOf(sub, "a")
		return st.UnrecoveredGaps >= 1 && w.Stats().ResidentBlocks >= 2*bigBlocks
	})
	if got := w.Stats().ResidentBlocks; got%bigBlocks != 0 || got >= 41*bigBlocks {
		t.Fatalf("resident %d blocks: the oversized batch's blocks were applied", got)
	}
	// The gap is counted when replay gives up; the health follows once the
	// worker's goroutine has handled it (a replay may still be RECOVERING).
	waitFor(t, "health UNSYNCED after a loss under gap_policy keep", func() bool {
		return statsOf(sub, "a").Health == events.HealthUnsynced
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// seqSink records the engine seqs of the batches it is given.
type seqSink struct {
	mu   sync.Mutex
	seqs []uint64
}

func (s *seqSink) ApplyBatch(*events.Batch) error { panic("ApplyBatchAt expected") }
func (s *seqSink) Reset(string)                   {}
func (s *seqSink) ApplyBatchAt(seq uint64, _ *events.Batch) error {
	s.mu.Lock()
	s.seqs = append(s.seqs, seq)
	s.mu.Unlock()
	return nil
}
func (s *seqSink) got() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]uint64(nil), s.seqs...)
}

// TestResumeAfterCheckpoint: a sink restored up to seq 59 (an agent's
// checkpoint) resumes at 60 from the engine's replay buffer, even with
// the engine idle, whether the endpoint was given to NewSubscriber or
// added before or during Run; when the buffer no longer reaches back to
// 60, the loss is counted, not hidden.
func TestResumeAfterCheckpoint(t *testing.T) {
	for _, how := range []string{"new", "added before Run", "added during Run"} {
		for _, forget := range []bool{false, true} {
			ctx, cancel := context.WithCancel(context.Background())
			pub, pubEP, replayEP := bigPublisher(t)
			for i := range 100 {
				if _, err := pub.Publish(chainBatch(i)); err != nil {
					t.Fatal(err)
				}
			}
			if forget {
				pub.ForgetReplay(80)
			}
			sink := &seqSink{}
			ep := zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: pubEP, ReplayEndpoint: replayEP, Sink: sink,
				Resume: true, ResumeAfter: 59}
			var given []zmq.Endpoint
			if how == "new" {
				given = append(given, ep)
			}
			sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{GapPolicy: events.GapKeep}, given...)
			if err != nil {
				t.Fatal(err)
			}
			if how == "added before Run" {
				if err := sub.AddEndpoint(ep); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx) }()
			if how == "added during Run" {
				waitFor(t, "Run to start", func() bool { return sub.AddEndpoint(ep) == nil })
			}
			first := uint64(60)
			if forget {
				first = 80
			}
			waitFor(t, "the batches after the checkpoint", func() bool { g := sink.got(); return len(g) == int(100-first) })
			g := sink.got()
			if g[0] != first || g[len(g)-1] != 99 {
				t.Fatalf("%s, forget=%v: applied seqs %d..%d, want %d..99", how, forget, g[0], g[len(g)-1], first)
			}
			st := statsOf(sub, "a")
			if forget != (st.UnrecoveredGaps == 1) || st.JoinedAtSeq != 0 {
				t.Fatalf("%s, forget=%v: %+v", how, forget, st)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
}
