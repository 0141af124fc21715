package indexer_test

import (
	"fmt"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/scoring"
)

// Example embeds kvindex in a router: an index fed with engines' events
// by worker name, and one call that scores and ranks a prompt. The events
// here are built by hand; in a router they come from a transport (e.g.
// events/zmq's Subscriber feeding each Worker, or Index.Apply).
func Example() {
	ix := indexer.New(indexer.Config{})
	model, err := ix.AddModel("meta-llama/Llama-3.1-8B-Instruct", 16) // vLLM's --block-size
	if err != nil {
		panic(err)
	}
	pods := []events.WorkerRef{{Pod: "vllm-0"}, {Pod: "vllm-1"}, {Pod: "vllm-2"}}
	for _, ref := range pods {
		if _, err := ix.AddWorker(indexer.WorkerInfo{Ref: ref, Model: model.Name}); err != nil {
			panic(err)
		}
	}

	// A 64-token system prompt, then a question: four full blocks.
	prompt := make([]uint32, 64)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	// vllm-0 cached all four blocks, vllm-1 the first two. Block hashes are
	// the engine's own (opaque); kvindex keys blocks by their tokens.
	stored := func(hashes []uint64, tokens []uint32) *events.Batch {
		return &events.Batch{Events: []events.Event{{
			Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: model.BlockSize(),
		}}}
	}
	if err := ix.Apply(pods[0], stored([]uint64{11, 12, 13, 14}, prompt)); err != nil {
		panic(err)
	}
	if err := ix.Apply(pods[1], stored([]uint64{91, 92}, prompt[:32])); err != nil {
		panic(err)
	}

	// Score and rank: every worker of the model (All), best first.
	s := scoring.New(ix, scoring.Options{})
	var res scoring.Result // reuse it: after the first call, Score allocates nothing
	if err := s.Score(&scoring.Request{Model: model, Tokens: prompt, All: true}, &res); err != nil {
		panic(err)
	}
	for _, c := range res.Ranked {
		fmt.Printf("%s: %d of %d blocks cached\n", c.Ref, c.Match.Blocks, res.Prompt.Blocks)
	}

	// Scale down: vllm-0 leaves; its blocks leave the answers with it.
	if err := ix.RemoveWorker(pods[0]); err != nil {
		panic(err)
	}
	if err := s.Score(&scoring.Request{Model: model, Tokens: prompt}, &res); err != nil {
		panic(err)
	}
	fmt.Printf("after removing vllm-0: best %s with %d blocks\n", res.Ranked[0].Ref, res.Ranked[0].Match.Blocks)
	// Output:
	// vllm-0/0: 4 of 4 blocks cached
	// vllm-1/0: 2 of 4 blocks cached
	// vllm-2/0: 0 of 4 blocks cached
	// after removing vllm-0: best vllm-1/0 with 2 blocks
}

// ExampleModel_PromptKeys computes block keys on the router's side, to
// send 8 bytes per block instead of the token ids.
func ExampleModel_PromptKeys() {
	model, err := indexer.NewModel("meta-llama/Llama-3.1-8B-Instruct", 16)
	if err != nil {
		panic(err)
	}
	tokens := make([]uint32, 40) // two full blocks and 8 tokens
	keys := model.PromptKeys(tokens, &indexer.PromptExtras{LoRAName: "sql-adapter"}, nil)
	fmt.Println(len(keys), "keys, scheme", model.Keying())
	// Output: 2 keys, scheme kvindex-key-v1
}
