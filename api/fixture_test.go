package api_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// blockSize is the block size of the test models.
const blockSize = 16

// fixture is an index served over real gRPC on TCP loopback.
type fixture struct {
	ix     *indexer.Index
	srv    *api.Server
	client *api.Client
	addr   string
}

// serve starts a gRPC server for ix on 127.0.0.1 and a client of it; both
// stop when the test ends.
func serve(tb testing.TB, ix *indexer.Index, stats events.StatsSource, opts api.Options) *fixture {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	if opts.Admission == (api.AdmissionOptions{}) {
		// Bursts of tens of calls must all be served here, also under the
		// race detector (~10x slower); admission control has its own tests.
		opts.Admission = api.AdmissionOptions{Target: time.Second, MaxQueueDelay: 10 * time.Second, MaxPending: 4096}
	}
	srv := api.NewServer(ix, stats, opts)
	g := grpc.NewServer(srv.GRPCOptions()...)
	srv.Register(g)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(lis)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := api.Dial(ctx, lis.Addr().String())
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	tb.Cleanup(func() {
		_ = c.Close()
		g.Stop()
		<-done
	})
	return &fixture{ix: ix, srv: srv, client: c, addr: lis.Addr().String()}
}

// mustModel adds a model with the test block size.
func mustModel(tb testing.TB, ix *indexer.Index, name string) {
	tb.Helper()
	if _, err := ix.AddModel(name, blockSize); err != nil {
		tb.Fatalf("add model %s: %v", name, err)
	}
}

// mustWorker adds worker pod/rank of model.
func mustWorker(tb testing.TB, ix *indexer.Index, model, pod string, rank int) *indexer.Worker {
	tb.Helper()
	w, err := ix.AddWorker(indexer.WorkerInfo{
		Ref:      events.WorkerRef{Pod: pod, DPRank: rank},
		Model:    model,
		Endpoint: "tcp://" + pod + ":5557",
	})
	if err != nil {
		tb.Fatalf("add worker %s/%d: %v", pod, rank, err)
	}
	return w
}

// prompt returns n blocks of tokens, distinct per seed.
func prompt(seed uint32, nblocks int) []uint32 {
	t := make([]uint32, nblocks*blockSize)
	for i := range t {
		t[i] = seed*100000 + uint32(i)
	}
	return t
}

// hashes returns engine block hashes base+from .. base+to-1.
func hashes(base uint64, from, to int) []uint64 {
	h := make([]uint64, 0, to-from)
	for i := from; i < to; i++ {
		h = append(h, base+uint64(i))
	}
	return h
}

// stored is a BlockStored event for blocks [from, to) of tokens, with
// engine hashes base+i, chained to block from-1.
func stored(base uint64, tokens []uint32, from, to int) events.Event {
	ev := events.Event{
		Kind:        events.KindBlockStored,
		BlockHashes: hashes(base, from, to),
		TokenIDs:    tokens[from*blockSize : to*blockSize],
		BlockSize:   blockSize,
	}
	if from > 0 {
		ev.ParentHash = base + uint64(from-1)
		ev.HasParent = true
	}
	return ev
}

// removed is a BlockRemoved event for engine hashes base+[from, to) in medium m.
func removed(base uint64, from, to int, m events.Medium) events.Event {
	return events.Event{Kind: events.KindBlockRemoved, BlockHashes: hashes(base, from, to), Medium: m}
}

// apply applies events as one batch and fails the test on any problem.
func apply(tb testing.TB, w *indexer.Worker, evs ...events.Event) {
	tb.Helper()
	if err := w.ApplyBatch(&events.Batch{Timestamp: 1, Events: evs}); err != nil {
		tb.Fatalf("apply to %s: %v", w.Info().Ref, err)
	}
}

// ref is a proto WorkerRef.
func ref(pod string, rank uint32) *kvindexv1.WorkerRef {
	return &kvindexv1.WorkerRef{Pod: pod, DpRank: rank}
}
