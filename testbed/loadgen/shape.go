package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// Shape is a fleet of Workers and the Prompts distinct prompts of
// PromptBlocks blocks sent to it in turn. Every prompt starts with the
// same SharedBlocks blocks (a system prompt), which every worker holds;
// the rest of each prompt (its tail) is unique to it and is held, in
// full, by TailHolders workers.
type Shape struct {
	Model        string
	BlockSize    int
	Workers      int
	PromptBlocks int
	SharedBlocks int
	TailHolders  int
	Prompts      int
	// FillerBlocks is how many other blocks each worker holds (chains of
	// 64 that no prompt matches), so that the heap the garbage collector
	// paces itself by has a production size: with a toy-sized index the
	// collector's pauses set the p99.
	FillerBlocks int
}

// DefaultShape is the `make bench` gRPC row's fleet: the 128-block,
// 8-worker Score of the in-process rows, with a 32-block shared prefix and
// each tail held by 2 workers, over 256 prompts; each worker also holds
// 200 k other blocks (3.2 M tokens, what one vLLM GPU of a 8B model
// caches), 1.6 M residencies in all.
func DefaultShape() Shape {
	return Shape{Model: "bench", BlockSize: 16, Workers: 8, PromptBlocks: 128, SharedBlocks: 32, TailHolders: 2,
		Prompts: 256, FillerBlocks: 200_000}
}

// Validate reports the first field that makes no sense.
func (s Shape) Validate() error {
	switch {
	case s.Model == "":
		return errors.New("loadgen: shape: empty model name")
	case s.BlockSize <= 0:
		return fmt.Errorf("loadgen: shape: block size %d must be positive", s.BlockSize)
	case s.Workers <= 0:
		return fmt.Errorf("loadgen: shape: %d workers, want at least 1", s.Workers)
	case s.PromptBlocks <= 0:
		return fmt.Errorf("loadgen: shape: %d prompt blocks, want at least 1", s.PromptBlocks)
	case s.SharedBlocks < 0 || s.SharedBlocks > s.PromptBlocks:
		return fmt.Errorf("loadgen: shape: shared prefix of %d blocks must be in [0, %d]", s.SharedBlocks, s.PromptBlocks)
	case s.TailHolders < 0 || s.TailHolders > s.Workers:
		return fmt.Errorf("loadgen: shape: %d tail holders must be in [0, %d workers]", s.TailHolders, s.Workers)
	case s.Prompts <= 0:
		return fmt.Errorf("loadgen: shape: %d prompts, want at least 1", s.Prompts)
	case s.FillerBlocks < 0:
		return fmt.Errorf("loadgen: shape: %d filler blocks must not be negative", s.FillerBlocks)
	}
	return nil
}

// String describes the shape in one line.
func (s Shape) String() string {
	return fmt.Sprintf("%d workers, %d-block prompts (%d tokens), %d-block prefix held by all, tails held by %d, %d prompts, %d other blocks per worker",
		s.Workers, s.PromptBlocks, s.PromptBlocks*s.BlockSize, s.SharedBlocks, s.TailHolders, s.Prompts, s.FillerBlocks)
}

// Prompt returns prompt i's token ids; the same i always gives the same
// tokens, so that a remote index loaded by another process with the same
// shape matches them.
func (s Shape) Prompt(i int) []uint32 {
	toks := make([]uint32, 0, s.PromptBlocks*s.BlockSize)
	for b := range s.PromptBlocks {
		toks = append(toks, s.blockTokens(i, b)...)
	}
	return toks
}

// blockTokens returns the tokens of block b of prompt i: shared blocks
// are the same for every prompt.
func (s Shape) blockTokens(i, b int) []uint32 {
	seed := uint64(b)<<32 | uint64(i+1)
	if b < s.SharedBlocks {
		seed = uint64(b) << 32
	}
	toks := make([]uint32, s.BlockSize)
	for t := range toks {
		seed = seed*6364136223846793005 + 1442695040888963407
		toks[t] = uint32(seed>>33) % 151000
	}
	return toks
}

// Load adds the shape's model and workers to ix and stores what each
// worker holds: the shared prefix on every worker, each prompt's tail on
// its holders. Engine hashes are made up, unique per block.
func (s Shape) Load(ix *indexer.Index) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if _, err := ix.AddModel(s.Model, s.BlockSize); err != nil {
		return fmt.Errorf("loadgen: load shape: %w", err)
	}
	ws := make([]*indexer.Worker, s.Workers)
	for w := range ws {
		var err error
		ws[w], err = ix.AddWorker(indexer.WorkerInfo{
			Ref:   events.WorkerRef{Pod: fmt.Sprintf("bench-%d", w)},
			Model: s.Model,
		})
		if err != nil {
			return fmt.Errorf("loadgen: load shape: %w", err)
		}
	}
	hash := func(i, b int) uint64 { // engine hash of block b of prompt i
		if b < s.SharedBlocks {
			return 1<<63 | uint64(b)
		}
		return uint64(i+1)<<32 | uint64(b)
	}
	stored := func(i, from, to int) events.Event {
		ev := events.Event{Kind: events.KindBlockStored, BlockSize: s.BlockSize}
		if from > 0 {
			ev.ParentHash, ev.HasParent = hash(i, from-1), true
		}
		for b := from; b < to; b++ {
			ev.BlockHashes = append(ev.BlockHashes, hash(i, b))
			ev.TokenIDs = append(ev.TokenIDs, s.blockTokens(i, b)...)
		}
		return ev
	}
	apply := func(w int, ev events.Event) error {
		if err := ws[w].ApplyBatch(&events.Batch{Events: []events.Event{ev}}); err != nil {
			return fmt.Errorf("loadgen: load shape: worker %d: %w", w, err)
		}
		return nil
	}
	if s.SharedBlocks > 0 {
		for w := range ws {
			if err := apply(w, stored(0, 0, s.SharedBlocks)); err != nil {
				return err
			}
		}
	}
	if s.SharedBlocks < s.PromptBlocks {
		for i := range s.Prompts {
			for j := range s.TailHolders { // workers (i*TailHolders+j) mod Workers
				if err := apply((i*s.TailHolders+j)%s.Workers, stored(i, s.SharedBlocks, s.PromptBlocks)); err != nil {
					return err
				}
			}
		}
	}
	return s.loadFiller(ws)
}

// loadFiller stores FillerBlocks blocks on each worker in chains of 64,
// with token ids from a seed space the prompts do not use.
func (s Shape) loadFiller(ws []*indexer.Worker) error {
	const chain = 64
	var ev events.Event
	seed := uint64(0x5eed)
	for w, wk := range ws {
		for done := 0; done < s.FillerBlocks; done += chain {
			n := min(chain, s.FillerBlocks-done)
			ev = events.Event{Kind: events.KindBlockStored, BlockSize: s.BlockSize,
				BlockHashes: ev.BlockHashes[:0], TokenIDs: ev.TokenIDs[:0]}
			for b := range n {
				ev.BlockHashes = append(ev.BlockHashes, 1<<62|uint64(w)<<40|uint64(done+b))
				for range s.BlockSize {
					seed = seed*6364136223846793005 + 1442695040888963407
					ev.TokenIDs = append(ev.TokenIDs, uint32(seed>>33)%151000)
				}
			}
			if done > 0 {
				ev.ParentHash, ev.HasParent = 1<<62|uint64(w)<<40|uint64(done-1), true
			}
			if err := wk.ApplyBatch(&events.Batch{Events: []events.Event{ev}}); err != nil {
				return fmt.Errorf("loadgen: load shape: worker %d filler: %w", w, err)
			}
		}
	}
	return nil
}

// server is Embedded's and Canned's gRPC server, serving on a goroutine
// of its own until Close.
type server struct {
	Addr string // host:port
	g    *grpc.Server
	done chan struct{}
	once sync.Once
}

// serve serves g on listen ("host:port"; "" means a free loopback port).
func serve(ctx context.Context, g *grpc.Server, listen string) (*server, error) {
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("loadgen: serve on %s: %w", listen, err)
	}
	s := &server{Addr: lis.Addr().String(), g: g, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_ = g.Serve(lis) // returns when Close stops g
	}()
	return s, nil
}

// Wait blocks until the server stops (Close) or ctx is done.
func (s *server) Wait(ctx context.Context) {
	select {
	case <-s.done:
	case <-ctx.Done():
	}
}

// Close stops the server, ending calls in flight, and waits for it.
func (s *server) Close() {
	s.once.Do(func() {
		s.g.Stop()
		<-s.done
	})
}

// Embedded is an index loaded with a shape, served by api.Server over
// real gRPC.
type Embedded struct{ *server }

// StartEmbedded loads an index with shape and serves it on listen
// ("host:port"; "" means a free loopback port) with opts (zero: the
// daemon's defaults, admission control included). Close stops it.
func StartEmbedded(ctx context.Context, shape Shape, listen string, opts api.Options) (*Embedded, error) {
	ix := indexer.New(indexer.Config{})
	if err := shape.Load(ix); err != nil {
		return nil, err
	}
	srv := api.NewServer(ix, nil, opts)
	g := grpc.NewServer(srv.GRPCOptions()...)
	srv.Register(g)
	s, err := serve(ctx, g, listen)
	if err != nil {
		return nil, err
	}
	return &Embedded{s}, nil
}

// ScoreDo returns a Do that sends Score for the shape's prompts through
// api.Client: request k asks about prompt k mod Prompts, sender g over
// clients[g mod len(clients)]. With keys set, requests carry the prompts'
// content keys instead of token ids. With check set (for an index loaded
// by Shape.Load), a reply whose longest match is not what the shape
// stored counts as an error.
//
// Each prompt's ScoreRequest is built once, as a router holds a prompt's
// token ids before it asks. Without preencoded every call marshals it, as
// a Go router does; with it each is marshalled once and its bytes written
// as they are (the overload rows need one generator core to offer a
// server core three times what it takes).
func ScoreDo(shape Shape, clients []*api.Client, keys, check, preencoded bool) (Do, error) {
	if err := shape.Validate(); err != nil {
		return nil, err
	}
	msgs := scoreMessages(shape, keys)
	var reqs [][]byte
	for i, m := range msgs {
		if !preencoded {
			break
		}
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("loadgen: marshal prompt %d: %w", i, err)
		}
		reqs = append(reqs, b)
	}
	codec := grpc.ForceCodecV2(preencodedCodec{replies: api.NewCodec()})
	return func(ctx context.Context, g int, k int64) error {
		i := k % int64(len(msgs))
		c := clients[g%len(clients)]
		var resp *kvindexv1.ScoreResponse
		var err error
		if preencoded {
			resp = new(kvindexv1.ScoreResponse)
			err = c.Conn().Invoke(ctx, kvindexv1.IndexService_Score_FullMethodName, encoded(reqs[i]), resp, codec)
		} else {
			resp, err = c.Score(ctx, msgs[i])
		}
		if err != nil {
			return fmt.Errorf("loadgen: Score of prompt %d: %w", i, err)
		}
		if check {
			return checkScore(shape, i, resp)
		}
		return nil
	}, nil
}

// checkScore checks a reply about prompt i of an index that Shape.Load
// filled: the longest match must be what the shape stored.
func checkScore(shape Shape, i int64, resp *kvindexv1.ScoreResponse) error {
	best, want := uint32(0), uint32(shape.SharedBlocks)
	for _, w := range resp.GetWorkers() {
		best = max(best, w.GetMatchedBlocks())
	}
	if shape.TailHolders > 0 {
		want = uint32(shape.PromptBlocks)
	}
	if best != want {
		return fmt.Errorf("loadgen: Score of prompt %d: longest match %d blocks, the shape stored %d", i, best, want)
	}
	return nil
}

// scoreMessages builds one ScoreRequest per prompt of shape (valid).
func scoreMessages(shape Shape, keys bool) []*kvindexv1.ScoreRequest {
	reqs := make([]*kvindexv1.ScoreRequest, shape.Prompts)
	for i := range reqs {
		reqs[i] = &kvindexv1.ScoreRequest{Model: shape.Model, TokenIds: shape.Prompt(i)}
		if keys {
			for _, k := range indexer.PromptKeys(shape.Model, shape.BlockSize, reqs[i].TokenIds, nil, nil) {
				reqs[i].BlockKeys = append(reqs[i].BlockKeys, uint64(k))
			}
			reqs[i].TokenIds = nil
		}
	}
	return reqs
}
