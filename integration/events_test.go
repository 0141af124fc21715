package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// lose publishes evs as one batch that never reaches the subscriber but
// stays in the engine's replay buffer.
func (f *fleet) lose(podName string, rank int, evs ...events.Event) uint64 {
	f.t.Helper()
	seq, err := f.pods[podName].pubs[rank].PublishLost(&events.Batch{Timestamp: 1, Events: evs, DPRank: rank, HasDPRank: true})
	if err != nil {
		f.t.Fatal(err)
	}
	return seq
}

// waitIdle waits until the worker has no replay in flight and has been
// heard from (the join replay at start included).
func (f *fleet) waitIdle(podName string, rank int) {
	f.t.Helper()
	f.waitFor(func() bool {
		for _, s := range f.d.Subscriber().WorkerStats() {
			if s.Worker.Pod == podName && s.Worker.DPRank == rank {
				return s.Replays > 0 && s.Health != events.HealthRecovering
			}
		}
		return false
	}, podName+" to finish its join replay")
}

func health(resp *kvindexv1.ScoreResponse, podName string) kvindexv1.WorkerHealth {
	for _, w := range resp.GetWorkers() {
		if w.GetWorker().GetPod() == podName {
			return w.GetHealth()
		}
	}
	return -1
}

// TestGapFilledByReplay: a batch lost between PUB and SUB is fetched from
// the engine's replay socket, in both of vLLM's reply forms, and applied in
// order before the batch that revealed the gap.
func TestGapFilledByReplay(t *testing.T) {
	for _, frames := range []int{3, 4} {
		t.Run(fmt.Sprintf("%d-frame", frames), func(t *testing.T) {
			f := startFleet(t, podSpec{name: "a", replayFrames: frames, enc: events.EncodeOptions{Encoding: events.EncodingMap}})
			f.waitIdle("a", 0)
			var eng engine
			prompt := tokens("replayed prompt", 8*blockSize)
			ev1, h1 := eng.store(0, prompt[:3*blockSize])
			ev2, h2 := eng.store(h1[2], prompt[3*blockSize:6*blockSize])
			ev3, _ := eng.store(h2[2], prompt[6*blockSize:])
			f.publish("a", 0, ev1)
			f.lose("a", 0, ev2)
			f.publish("a", 0, ev3)

			resp := f.score(&kvindexv1.ScoreRequest{TokenIds: prompt})
			if n, _ := matched(resp, "a", 0); n != 8 {
				t.Fatalf("after the replayed gap: %d blocks, want 8", n)
			}
			if h := health(resp, "a"); h != kvindexv1.WorkerHealth_WORKER_HEALTH_OK {
				t.Fatalf("health %v, want OK", h)
			}
			w := f.status("a", 0)
			if w.GetGaps() != 1 || w.GetMissedBatches() != 1 || w.GetReplays() != 2 || w.GetReplayedBatches() != 1 ||
				w.GetUnrecoveredGaps() != 0 || w.GetReplayFailures() != 0 || w.GetOrphans() != 0 || w.GetLastSeq() != 2 || w.GetResets() != 0 {
				t.Fatalf("status: %v", w)
			}
		})
	}
}

// TestGapBeyondReplay: when the engine's replay buffer no longer holds the
// lost batch, the gap policy decides: reset (the default) forgets the
// worker's blocks; keep flags the worker UNSYNCED until its next clear.
func TestGapBeyondReplay(t *testing.T) {
	for _, policy := range []string{"reset", "keep"} {
		t.Run(policy, func(t *testing.T) {
			f := newFleet(t, fleetOptions{configure: func(c *config.Config) { c.Events.GapPolicy = policy }}, podSpec{name: "a", replayFrames: 4})
			f.start()
			f.waitIdle("a", 0)
			var eng engine
			prompt := tokens("prompt", 8*blockSize)
			ev1, h1 := eng.store(0, prompt[:3*blockSize])
			ev2, h2 := eng.store(h1[2], prompt[3*blockSize:6*blockSize])
			ev3, _ := eng.store(h2[2], prompt[6*blockSize:])
			f.publish("a", 0, ev1)
			lost := f.lose("a", 0, ev2)
			f.pods["a"].pubs[0].ForgetReplay(lost + 1) // the buffer moved on
			f.publish("a", 0, ev3)

			resp := f.score(&kvindexv1.ScoreRequest{TokenIds: prompt})
			n, _ := matched(resp, "a", 0)
			w := f.status("a", 0)
			if w.GetGaps() != 1 || w.GetUnrecoveredGaps() != 1 || w.GetReplays() != 2 || w.GetOrphans() != 2 {
				t.Fatalf("status: %v", w)
			}
			switch policy {
			case "reset":
				// The blocks after the loss are orphans (their parent was
				// lost): the worker is DEGRADED, with the reason, not OK.
				if n != 0 || w.GetResets() != 1 || w.GetResidentBlocks() != 2 || w.GetHealth() != kvindexv1.WorkerHealth_WORKER_HEALTH_DEGRADED ||
					!strings.Contains(w.GetHealthReason(), "unknown parent block") {
					t.Fatalf("reset policy: matched %d, status %v", n, w)
				}
				if !strings.Contains(w.GetLastReset(), "lost batches 1..1") {
					t.Fatalf("last reset %q", w.GetLastReset())
				}
			case "keep":
				if n != 3 || w.GetResets() != 0 || w.GetResidentBlocks() != 5 {
					t.Fatalf("keep policy: matched %d, status %v", n, w)
				}
				if h := health(resp, "a"); h != kvindexv1.WorkerHealth_WORKER_HEALTH_UNSYNCED {
					t.Fatalf("keep policy: Score health %v, want UNSYNCED", h)
				}
				f.publish("a", 0, cleared)
				f.waitFor(func() bool {
					return f.status("a", 0).GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_OK
				}, "health OK after AllBlocksCleared")
			}
		})
	}
}

// TestLateJoin: kvindex starts after the engine has cached blocks; the join
// replay teaches it what the engine holds. When the engine's buffer no
// longer reaches back to the start, the blocks whose parents are lost are
// counted as orphans and the late join is reported.
func TestLateJoin(t *testing.T) {
	t.Run("full history", func(t *testing.T) {
		f := newFleet(t, fleetOptions{}, podSpec{name: "a", replayFrames: 4})
		var eng engine
		prompt := tokens("cached before kvindex started", 5*blockSize)
		ev1, h1 := eng.store(0, prompt[:2*blockSize])
		ev2, _ := eng.store(h1[1], prompt[2*blockSize:])
		pub := f.pods["a"].pubs[0]
		for _, ev := range []events.Event{ev1, ev2} {
			if _, err := pub.Publish(&events.Batch{Events: []events.Event{ev}}); err != nil { // nobody listens yet
				t.Fatal(err)
			}
		}
		f.start()
		f.waitIdle("a", 0)
		if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: prompt}), "a", 0); n != 5 {
			t.Fatalf("after join replay: %d, want 5", n)
		}
		w := f.status("a", 0)
		if w.GetReplays() != 1 || w.GetReplayedBatches() != 2 || w.GetLastSeq() != 1 || w.GetJoinedAtSeq() != 0 || w.GetOrphans() != 0 {
			t.Fatalf("status: %v", w)
		}
		// Live events continue from there.
		ev3, _ := eng.store(0, tokens("live", blockSize))
		f.publish("a", 0, ev3)
		if w := f.status("a", 0); w.GetGaps() != 0 || w.GetLastSeq() != 2 {
			t.Fatalf("after live event: %v", w)
		}
	})
	t.Run("truncated history", func(t *testing.T) {
		f := newFleet(t, fleetOptions{}, podSpec{name: "a", replayFrames: 3})
		var eng engine
		prompt := tokens("cached long ago", 5*blockSize)
		ev1, h1 := eng.store(0, prompt[:2*blockSize])
		ev2, _ := eng.store(h1[1], prompt[2*blockSize:])
		pub := f.pods["a"].pubs[0]
		pub.Publish(&events.Batch{Events: []events.Event{ev1}})
		pub.Publish(&events.Batch{Events: []events.Event{ev2}})
		pub.ForgetReplay(1)
		f.start()
		f.waitIdle("a", 0)
		if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: prompt}), "a", 0); n != 0 {
			t.Fatalf("blocks after a lost parent matched %d", n)
		}
		w := f.status("a", 0)
		if w.GetJoinedAtSeq() != 1 || w.GetOrphans() != 3 || w.GetResidentBlocks() != 3 || w.GetReplayedBatches() != 1 {
			t.Fatalf("status: %v", w)
		}
	})
}

// TestRestartWithReplay: the engine restarts (seq back to 0) and its first
// batch is lost; the restart resets the worker and a replay from seq 0 of
// the new process recovers the lost batch.
func TestRestartWithReplay(t *testing.T) {
	f := startFleet(t, podSpec{name: "a", replayFrames: 4})
	f.waitIdle("a", 0)
	var eng engine
	old := tokens("old process", 3*blockSize)
	evOld, _ := eng.store(0, old)
	f.publish("a", 0, evOld)
	f.publish("a", 0, evOld)
	f.publish("a", 0, evOld)

	pub := f.pods["a"].pubs[0]
	pub.SetSeq(0) // a new process
	fresh := tokens("new process", 4*blockSize)
	ev1, h1 := eng.store(0, fresh[:2*blockSize])
	ev2, _ := eng.store(h1[1], fresh[2*blockSize:])
	f.lose("a", 0, ev1)
	f.publish("a", 0, ev2)

	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: old}), "a", 0); n != 0 {
		t.Fatalf("old process's blocks still match: %d", n)
	}
	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: fresh}), "a", 0); n != 4 {
		t.Fatalf("new process's blocks: %d, want 4", n)
	}
	w := f.status("a", 0)
	if w.GetRestarts() != 1 || w.GetResets() != 1 || w.GetReplays() != 2 || w.GetReplayedBatches() != 1 || w.GetOrphans() != 0 || w.GetLastSeq() != 1 {
		t.Fatalf("status: %v", w)
	}
}

// TestStaleEndpoint: an engine whose socket goes away is marked stale after
// the configured time and left out of Score answers (still listed, flagged,
// when named as a candidate); when it comes back, so does the worker.
func TestStaleEndpoint(t *testing.T) {
	f := newFleet(t, fleetOptions{configure: func(c *config.Config) { c.Events.StaleAfterDisconnect = 300 * time.Millisecond }}, podSpec{name: "a"}, podSpec{name: "b"})
	f.start()
	var ea, eb engine
	prompt := tokens("shared", 4*blockSize)
	evA, _ := ea.store(0, prompt)
	evB, _ := eb.store(0, prompt[:2*blockSize])
	f.publish("a", 0, evA)
	f.publish("b", 0, evB)
	if resp := f.score(&kvindexv1.ScoreRequest{TokenIds: prompt}); len(resp.GetWorkers()) != 2 || health(resp, "a") != kvindexv1.WorkerHealth_WORKER_HEALTH_OK {
		t.Fatalf("before: %v", resp.GetWorkers())
	}

	endpoint := f.d.Index().LookupWorker(events.WorkerRef{Pod: "a"}).Info().Endpoint
	f.pods["a"].pubs[0].Close()
	f.waitFor(func() bool { return f.status("a", 0).GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_STALE }, "a to go stale")
	w := f.status("a", 0)
	if w.GetStaleSince() == nil || w.GetStaleTransitions() != 1 || w.GetConnected() {
		t.Fatalf("stale status: %v", w)
	}
	resp := f.score(&kvindexv1.ScoreRequest{TokenIds: prompt})
	if len(resp.GetWorkers()) != 1 || resp.GetWorkers()[0].GetWorker().GetPod() != "b" {
		t.Fatalf("stale worker not left out: %v", resp.GetWorkers())
	}
	resp = f.score(&kvindexv1.ScoreRequest{TokenIds: prompt, Workers: []*kvindexv1.WorkerRef{{Pod: "a"}, {Pod: "b"}}})
	if n, _ := matched(resp, "a", 0); n != 4 || health(resp, "a") != kvindexv1.WorkerHealth_WORKER_HEALTH_STALE {
		t.Fatalf("stale candidate: %v", resp.GetWorkers())
	}
	if !strings.Contains(f.metrics(), `kvindex_worker_health{dp_rank="0",model="test/model",pod="a",state="STALE"} 1`) {
		t.Fatal("/metrics does not show a as STALE")
	}
	// Route never chooses a stale worker, even the one holding the most.
	r, rerr := f.client.Route(t.Context(), &kvindexv1.RouteRequest{RequestId: "r1", Score: &kvindexv1.ScoreRequest{Model: model, TokenIds: prompt}})
	if rerr != nil || r.GetChosen().GetPod() != "b" {
		t.Fatalf("Route with a stale: chose %v (%v), want b", r.GetChosen(), rerr)
	}

	// The engine comes back on the same endpoint.
	var pub *enginepub.Publisher
	var err error
	for i := 0; i < 100; i++ {
		if pub, err = enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: endpoint, Topic: "kv@a@" + model, Bind: true}); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	f.waitFor(func() bool { return f.status("a", 0).GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_OK }, "a to come back")
	if resp := f.score(&kvindexv1.ScoreRequest{TokenIds: prompt}); len(resp.GetWorkers()) != 2 {
		t.Fatalf("after coming back: %v", resp.GetWorkers())
	}
}

// TestSilentWorkerGoesStale: with stale_after_silence set, a worker that
// sends nothing for that long is stale until its next message.
func TestSilentWorkerGoesStale(t *testing.T) {
	f := newFleet(t, fleetOptions{configure: func(c *config.Config) { c.Events.StaleAfterSilence = 300 * time.Millisecond }}, podSpec{name: "a"})
	f.start()
	var eng engine
	ev, _ := eng.store(0, tokens("x", blockSize))
	f.publish("a", 0, ev)
	f.waitFor(func() bool { return f.status("a", 0).GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_STALE }, "a to go stale")
	f.publish("a", 0, ev)
	if h := f.status("a", 0).GetHealth(); h != kvindexv1.WorkerHealth_WORKER_HEALTH_OK {
		t.Fatalf("after a message: %v", h)
	}
}

// TestPushModeTopics: kvindex binds SUBs that engines connect to (push
// mode), beside a pull-mode pod. Workers are told apart by topic: llm-d's
// kv@<pod>@<model> as is, any other topic through a configured route; DP
// ranks by port, as vLLM offsets a connecting endpoint's port by the rank
// (the listener's dp_size 2 binds two ports). Engines connect before and
// after the bind (the slow-joiner case): nothing is lost once their
// subscription is in. A payload rank that disagrees with its port, and a
// topic that names no pod, are refused and counted.
func TestPushModeTopics(t *testing.T) {
	f := newFleet(t, fleetOptions{routes: []config.Route{{Topic: "my-engine-7", Pod: "vllm-7", Model: model}}},
		podSpec{name: "10.0.0.5:8000", push: true},                                // llm-d topic kv@10.0.0.5:8000@test/model
		podSpec{name: "vllm-7", push: true, topic: "my-engine-7", dpSize: 2},      // mapped topic, two ranks
		podSpec{name: "pulled"},                                                   // pull mode beside push
		podSpec{name: "other", push: true, model: "other/model", replayFrames: 0}, // a second model
	)
	f.start()
	var e1, e2, e3, e4, e5 engine
	p := tokens("push prompt", 3*blockSize)
	ev1, _ := e1.store(0, p)
	ev2, _ := e2.store(0, p[:blockSize])
	ev3, _ := e3.store(0, p[:2*blockSize])
	ev4, _ := e4.store(0, p)
	ev5, _ := e5.store(0, p)
	f.publish("10.0.0.5:8000", 0, ev1)
	f.publish("vllm-7", 1, ev2)
	f.publish("vllm-7", 0, ev3)
	f.publish("pulled", 0, ev4)
	f.publish("other", 0, ev5)

	resp := f.score(&kvindexv1.ScoreRequest{TokenIds: p})
	want := map[string]int{"10.0.0.5:8000/0": 3, "pulled/0": 3, "vllm-7/0": 2, "vllm-7/1": 1}
	if len(resp.GetWorkers()) != len(want) {
		t.Fatalf("workers: %v", resp.GetWorkers())
	}
	for _, w := range resp.GetWorkers() {
		name := fmt.Sprintf("%s/%d", w.GetWorker().GetPod(), w.GetWorker().GetDpRank())
		if int(w.GetMatchedBlocks()) != want[name] {
			t.Fatalf("%s matched %d, want %d", name, w.GetMatchedBlocks(), want[name])
		}
	}
	if resp := f.score(&kvindexv1.ScoreRequest{Model: "other/model", TokenIds: p}); len(resp.GetWorkers()) != 1 || resp.GetWorkers()[0].GetWorker().GetPod() != "other" {
		t.Fatalf("other model: %v", resp.GetWorkers())
	}
	rank1, err := events.OffsetEndpoint(f.pushAddr, 1)
	if err != nil {
		t.Fatal(err)
	}
	if w := f.status("vllm-7", 1); w.GetModel() != model || w.GetTopic() != "my-engine-7" || w.GetResidentBlocks() != 1 || w.GetBatches() != 1 || w.GetEndpoint() != rank1 {
		t.Fatalf("vllm-7/1: %v, want endpoint %s", w, rank1)
	}
	if w := f.status("vllm-7", 0); w.GetEndpoint() != f.pushAddr || w.GetResidentBlocks() != 2 {
		t.Fatalf("vllm-7/0: %v, want endpoint %s", w, f.pushAddr)
	}

	// Rank 0's payload on rank 1's port: refused, vllm-7/1 untouched.
	liar, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: rank1, Topic: "my-engine-7"})
	if err != nil {
		t.Fatal(err)
	}
	defer liar.Close()
	if err := liar.WaitForSubscribers(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	liar.Publish(&events.Batch{Events: []events.Event{ev1}, HasDPRank: true})
	f.waitFor(func() bool {
		return strings.Contains(f.metrics(), `kvindex_push_refused_total{listener="`+f.pushAddr+`",reason="dp_rank_mismatch"} 1`)
	}, "the mismatched rank to be counted")
	if w := f.status("vllm-7", 1); w.GetResidentBlocks() != 1 || w.GetBatches() != 1 {
		t.Fatalf("vllm-7/1 after a mismatched rank: %v", w)
	}

	// A topic that maps to no pod is counted, not guessed.
	stray, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: f.pushAddr, Topic: "no-convention"})
	if err != nil {
		t.Fatal(err)
	}
	defer stray.Close()
	if err := stray.WaitForSubscribers(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	stray.Publish(&events.Batch{Events: []events.Event{ev1}})
	f.waitFor(func() bool {
		return strings.Contains(f.metrics(), `kvindex_push_refused_total{listener="`+f.pushAddr+`",reason="unknown_topic"} 1`)
	}, "the stray message to be counted")
}
