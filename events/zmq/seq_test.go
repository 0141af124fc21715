package zmq_test

import (
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/zmq"
)

// A message repeated with its seq (the same payload twice) is a duplicate:
// dropped and counted, not an engine restart that clears the worker.
func TestDuplicateSeqIsNotARestart(t *testing.T) {
	r := newPushRig(t, zmq.PushListener{})
	p := r.engine("kv@p@m")
	b1, b2 := storeBatch(0, 1), storeBatch(0, 2)
	for _, b := range []*events.Batch{b1, b2} {
		if _, err := p.Publish(b); err != nil {
			t.Fatal(err)
		}
	}
	p.SetSeq(1)
	if _, err := p.Publish(b2); err != nil { // seq 1 again, same payload
		t.Fatal(err)
	}
	if _, err := p.Publish(storeBatch(0, 3)); err != nil { // seq 2
		t.Fatal(err)
	}
	waitFor(t, "three batches", func() bool { st := statsOf(r.sub, "p"); return st.LastSeq == 2 && st.Duplicates == 1 })
	st := statsOf(r.sub, "p")
	w := r.ix.LookupWorker(events.WorkerRef{Pod: "p"})
	if st.Restarts != 0 || w.Stats().Resets != 0 || w.Stats().ResidentBlocks != 3 {
		t.Fatalf("duplicate handled as a restart: stats %+v, index %+v", st, w.Stats())
	}
}

// Two publishers on one topic put the worker in CONFLICT once, instead of
// clearing it on every interleaved message; when one stops, the worker
// follows the other.
func TestTwoPublishersOnOneTopic(t *testing.T) {
	for _, tc := range []struct {
		name     string
		startOld uint64 // the first publisher's seq when the second starts at 0
	}{
		{"far apart", 5000},
		{"close together", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newPushRigWith(t, zmq.PushListener{}, func(o *zmq.SubscriberOptions) { o.ConflictQuiet = 300 * time.Millisecond })
			a := r.engine("kv@p@m")
			a.SetSeq(tc.startOld)
			if _, err := a.Publish(storeBatch(0, 1)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the first publisher's batch", func() bool { return statsOf(r.sub, "p").HasSeq })
			b := r.engine("kv@p@m")
			for i := range 10 {
				if _, err := b.Publish(storeBatch(0, uint64(100+i))); err != nil {
					t.Fatal(err)
				}
				if _, err := a.Publish(storeBatch(0, uint64(200+i))); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Millisecond)
			}
			waitFor(t, "CONFLICT", func() bool { return statsOf(r.sub, "p").Health == events.HealthConflict })
			st := statsOf(r.sub, "p")
			w := r.ix.LookupWorker(events.WorkerRef{Pod: "p"})
			resets := w.Stats().Resets
			if st.Conflicts != 1 || st.Restarts > 2 || resets > 5 || st.HealthReason == "" {
				t.Fatalf("conflict: stats %+v, index resets %d", st, resets)
			}
			// While both keep publishing, nothing more is cleared or applied.
			for i := range 20 {
				if _, err := b.Publish(storeBatch(0, uint64(400+i))); err != nil {
					t.Fatal(err)
				}
				if _, err := a.Publish(storeBatch(0, uint64(500+i))); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "the interleaved batches", func() bool { return statsOf(r.sub, "p").Dropped >= st.Dropped+40 })
			if now := statsOf(r.sub, "p"); now.Restarts != st.Restarts || w.Stats().Resets != resets || now.Health != events.HealthConflict || w.Stats().ResidentBlocks != 0 {
				t.Fatalf("in conflict the worker was cleared or fed again: stats %+v, index %+v", now, w.Stats())
			}
			// b stops; a goes on: the worker leaves CONFLICT and follows a.
			deadline := time.Now().Add(5 * time.Second)
			for i := 0; statsOf(r.sub, "p").Health == events.HealthConflict; i++ {
				if time.Now().After(deadline) {
					t.Fatalf("still in conflict: %+v", statsOf(r.sub, "p"))
				}
				if _, err := a.Publish(storeBatch(0, uint64(300+i))); err != nil {
					t.Fatal(err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if _, err := a.Publish(storeBatch(0, 999)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "a's batches applied again", func() bool {
				st := statsOf(r.sub, "p")
				return st.Health == events.HealthOK && w.Stats().ResidentBlocks >= 1
			})
			if st := statsOf(r.sub, "p"); st.Conflicts != 1 {
				t.Fatalf("conflicts %d after it ended, want 1", st.Conflicts)
			}
		})
	}
}

// SGLang's newest publisher: its live topic carries the engine's epoch,
// and snapshot barriers (batches with no events) go out on a barrier topic
// within the live sequence. Barriers are not errors; a new epoch is a
// restart even when the seq does not go back.
func TestSGLangEpochsAndBarriers(t *testing.T) {
	r := newPushRig(t, zmq.PushListener{})
	live := "kv@p@m\x00sgl-kv-epoch=5b1d"
	p := r.engine(live)
	for i := range 3 {
		if _, err := p.Publish(storeBatch(0, uint64(10+i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.PublishOn(live+"\x00sgl-kv-snapshot=barrier-1", &events.Batch{}); err != nil { // seq 3
		t.Fatal(err)
	}
	if _, err := p.Publish(storeBatch(0, 13)); err != nil { // seq 4
		t.Fatal(err)
	}
	waitFor(t, "five batches", func() bool { return statsOf(r.sub, "p").LastSeq == 4 })
	st := statsOf(r.sub, "p")
	w := r.ix.LookupWorker(events.WorkerRef{Pod: "p"})
	if st.DecodeErrors+st.ApplyErrors != 0 || st.Batches != 5 || st.Restarts != 0 || st.Topic != "kv@p@m" || w.Stats().ResidentBlocks != 4 {
		t.Fatalf("barrier handling: stats %+v, resident %d", st, w.Stats().ResidentBlocks)
	}
	if n := len(r.sub.Refusals()); n != 0 {
		t.Fatalf("refusals %+v: the epoch and barrier topics are the same worker's", r.sub.Refusals())
	}
	// A new process: new epoch, and (to show the epoch decides) a seq that
	// continues upwards.
	p.SetTopic("kv@p@m\x00sgl-kv-epoch=77e0")
	if _, err := p.Publish(storeBatch(0, 20)); err != nil { // seq 5
		t.Fatal(err)
	}
	waitFor(t, "the restart", func() bool { return statsOf(r.sub, "p").Restarts == 1 })
	waitFor(t, "the new epoch's block only", func() bool { return w.Stats().ResidentBlocks == 1 })
}
