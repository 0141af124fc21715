package integration

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TestDumpStormLeavesScoreAlone: 16 clients dump 10,000-block pages as
// fast as they are answered while another client scores. Every Score is
// answered, with the exact matches; the Dumps are served and refused by
// their own budget (limits.max_inspect, max_inspect_pending), each refusal
// an overload refusal counted with reason inspect, and Score's admission
// refuses nothing.
func TestDumpStormLeavesScoreAlone(t *testing.T) {
	const (
		dumpers  = 16
		page     = api.MaxDumpPageSize // 10,000 blocks
		resident = 12000
		chunk    = 1000 // blocks per published batch
		minScore = 100
	)
	f := newFleet(t, fleetOptions{configure: func(c *config.Config) {
		c.Limits.MaxInspect = 1
		c.Limits.MaxInspectPending = 2
		// Score's own bound on queueing is not under test: on a small,
		// shared machine a Score may wait for a core longer than the 50 ms
		// default while 16 Dumps run, and that refusal would be Score's
		// admission doing its job, not the inspection budget failing.
		c.Limits.MaxQueueDelay = 10 * time.Second
	}}, podSpec{name: "a"}, podSpec{name: "b"})
	f.start()

	// a holds a chain of 12,000 blocks; b the first 16 of it.
	var ea, eb engine
	chain := tokens("storm", resident*blockSize)
	var parent uint64
	for i := 0; i < resident; i += chunk {
		ev, hashes := ea.store(parent, chain[i*blockSize:(i+chunk)*blockSize])
		f.publish("a", 0, ev)
		parent = hashes[len(hashes)-1]
	}
	ev, _ := eb.store(0, chain[:16*blockSize])
	f.publish("b", 0, ev)

	var served, refused atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < dumpers; i++ {
		c, err := api.Dial(context.Background(), f.d.GRPCAddr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := c.Dump(ctx, &kvindexv1.DumpRequest{Worker: ref("a"), PageSize: page})
				cancel()
				switch {
				case err == nil:
					if len(resp.GetBlocks()) != page || resp.GetResidentKeys() != resident {
						t.Errorf("Dump: %d blocks of %d resident, want %d of %d", len(resp.GetBlocks()), resp.GetResidentKeys(), page, resident)
						return
					}
					served.Add(1)
				case api.IsOverloaded(err):
					refused.Add(1)
				default:
					t.Errorf("Dump: %v, want an answer or an overload refusal", err)
					return
				}
			}
		}()
	}

	// Score until the storm has been both served and refused, and at
	// least minScore times; every answer exact.
	scores := 0
	deadline := time.Now().Add(60 * time.Second)
	for scores < minScore || served.Load() == 0 || refused.Load() == 0 {
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatalf("after %d Scores: %d Dumps served, %d refused; want both", scores, served.Load(), refused.Load())
		}
		k := 1 + scores%64
		resp := f.score(&kvindexv1.ScoreRequest{TokenIds: chain[:k*blockSize]})
		if a, _ := matched(resp, "a", 0); a != k {
			t.Fatalf("Score %d: a matched %d blocks, want %d", scores, a, k)
		}
		if b, _ := matched(resp, "b", 0); b != min(k, 16) {
			t.Fatalf("Score %d: b matched %d blocks, want %d", scores, b, min(k, 16))
		}
		scores++
	}
	close(stop)
	wg.Wait()

	m := f.metrics()
	if v := metricValue(t, m, `kvindex_admission_refused_total{reason="inspect"}`); v != float64(refused.Load()) {
		t.Errorf("inspect refusals counted %v, the clients saw %d", v, refused.Load())
	}
	for _, reason := range []string{"overload", "pending", "queued"} {
		if v := metricValue(t, m, `kvindex_admission_refused_total{reason="`+reason+`"}`); v != 0 {
			t.Errorf("Score's admission refused %v calls for %s, want none", v, reason)
		}
	}
	t.Logf("%d Scores exact; Dumps: %d served, %d refused", scores, served.Load(), refused.Load())
}
