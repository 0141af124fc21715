package api_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// A router scores a prompt against a kvindex server. Here the server runs
// in-process on loopback, over an index fed one BlockStored event by hand.
func ExampleClient_Score() {
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel("llama", 4); err != nil {
		log.Fatal(err)
	}
	w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "pod-a"}, Model: "llama"})
	if err != nil {
		log.Fatal(err)
	}
	// pod-a caches the first two blocks of the prompt below.
	_ = w.ApplyBatch(&events.Batch{Events: []events.Event{{
		Kind:        events.KindBlockStored,
		BlockHashes: []uint64{0xa1, 0xa2},
		TokenIDs:    []uint32{1, 2, 3, 4, 5, 6, 7, 8},
		BlockSize:   4,
	}}})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	g := grpc.NewServer()
	api.NewServer(ix, nil, api.Options{}).Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()

	ctx := context.Background()
	c, err := api.Dial(ctx, lis.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	resp, err := c.Score(ctx, &kvindexv1.ScoreRequest{
		Model:    "llama",
		TokenIds: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("prompt: %d blocks of %d tokens\n", resp.GetPromptBlocks(), resp.GetBlockSize())
	for _, s := range resp.GetWorkers() {
		fmt.Printf("%s/%d holds %d blocks (%d tokens)\n", s.GetWorker().GetPod(), s.GetWorker().GetDpRank(), s.GetMatchedBlocks(), s.GetMatchedTokens())
	}
	// Output:
	// prompt: 3 blocks of 4 tokens
	// pod-a/0 holds 2 blocks (8 tokens)
}
