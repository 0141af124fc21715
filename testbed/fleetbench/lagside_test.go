package fleetbench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/embednats"
)

// TestMain lets this test binary run a role, as kvfleetbench does, when a
// test starts it as a child ("role NAME --opts JSON").
func TestMain(m *testing.M) {
	flag.Parse()
	if a := flag.Args(); len(a) == 4 && a[0] == "role" && a[2] == "--opts" {
		if err := RunRole(context.Background(), a[1], a[3], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// lapDigest is the digest of a worker of shape's workload from seed after
// its first lap, as an agent has it after its engine played that lap.
func lapDigest(t *testing.T, shape Shape, seed uint64) string {
	t.Helper()
	w, err := NewWorkload(shape, seed)
	if err != nil {
		t.Fatal(err)
	}
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel(benchModel, shape.BlockSize); err != nil {
		t.Fatal(err)
	}
	wk, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "test"}, Model: benchModel})
	if err != nil {
		t.Fatal(err)
	}
	var f Filler
	for i := range w.Len() {
		if err := wk.ApplyBatch(f.Fill(w, i, 0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	return strconv.FormatUint(wk.Digest(), 16)
}

// TestLagAgentsInProcesses runs the lag generator's agent side in two
// lag-agents processes (this test binary) for five engines, as the path
// and as the floor: every engine's lap reaches its agent (the digests are
// the lap's), the agents' lag histograms count every batch, the
// forwarders publish every frame, and the processes' CPU is read.
func TestLagAgentsInProcesses(t *testing.T) {
	shape := DefaultShape()
	const pods = 5
	for _, floor := range []bool{false, true} {
		t.Run(fmt.Sprintf("floor=%v", floor), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ns, err := embednats.Start("fleetbench-test")
			if err != nil {
				t.Fatal(err)
			}
			defer ns.Close()
			es, err := startEngines(pods, shape, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer closeEngines(es)
			side, err := startProcSide(ctx, ns.URL(), ports(es), floor, 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(side.kids) != 2 {
				t.Fatalf("%d processes, want 2", len(side.kids))
			}
			if err := waitSubscribed(ctx, es, 1); err != nil {
				t.Fatal(err)
			}
			sent := pods * es[0].w.Len()
			if _, err := playEngines(ctx, es, sent, 1e6); err != nil {
				t.Fatal(err)
			}
			if err := waitCaughtUp(ctx, side, floor, es, int64(sent)); err != nil {
				t.Fatal(err)
			}
			p, err := side.progress(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// An agent records a batch's lag just after its seq moves: the
			// last observation may trail the seq the wait above saw.
			var h *lagHist
			for deadline := time.Now().Add(10 * time.Second); ; {
				if h, err = side.agentLag(ctx); err != nil {
					t.Fatal(err)
				}
				if n := len(h.Counts); floor || (n > 0 && h.Counts[n-1] >= float64(sent)) || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			d, err := side.digests(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if floor {
				if p.Forwarded != int64(sent) || p.Failed != 0 || len(p.Seqs) != 0 {
					t.Errorf("forwarders: %d forwarded, %d failed, %d seqs; want %d, 0, 0", p.Forwarded, p.Failed, len(p.Seqs), sent)
				}
				if len(h.Counts) != 0 || len(d.Digests) != 0 {
					t.Errorf("forwarders reported a lag histogram of %d buckets and %d digests", len(h.Counts), len(d.Digests))
				}
			} else {
				for i, e := range es {
					if p.Seqs[e.Pod] != e.lastSeq {
						t.Errorf("%s: agent at seq %d, engine at %d", e.Pod, p.Seqs[e.Pod], e.lastSeq)
					}
					if want := lapDigest(t, shape, 1+uint64(i)); d.Digests[e.Pod] != want {
						t.Errorf("%s: digest %s, want %s", e.Pod, d.Digests[e.Pod], want)
					}
				}
				if len(d.Digests) != pods {
					t.Errorf("%d digests, want %d", len(d.Digests), pods)
				}
				if n := len(h.Counts); n == 0 || h.Counts[n-1] != float64(sent) {
					t.Errorf("agent lag histogram: %v observations, want %d", h.Counts, sent)
				}
			}
			if side.cpu() <= 0 {
				t.Error("no CPU read for the lag-agents processes")
			}
			if err := side.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
