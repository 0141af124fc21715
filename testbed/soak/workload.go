package soak

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
)

// WorkloadOptions shape one engine's requests: Conversations open at
// once, each ending after 1..MaxTurns turns or once its prompt is past
// MaxTokens; each turn adds a user message of 1..UserTokens and a reply
// of 1..ReplyTokens to the next turn's prompt. OneShot is the fraction of
// requests that are a system prompt and a fresh question. All must be
// positive.
type WorkloadOptions struct {
	Conversations, MaxTurns, MaxTokens, UserTokens, ReplyTokens int
	OneShot                                                     float64
}

// DefaultWorkloadOptions are the soak's: a dozen conversations of up to
// 1,600 tokens over shared system prompts.
func DefaultWorkloadOptions() WorkloadOptions {
	return WorkloadOptions{Conversations: 12, MaxTurns: 8, MaxTokens: 1600, UserTokens: 120, ReplyTokens: 240, OneShot: 0.15}
}

// SystemPrompts returns n system prompts shared by every engine of model:
// 3 to 30 blocks of blockSize tokens each plus a partial block, derived
// from seed and the model name only.
func SystemPrompts(seed uint64, model string, blockSize, n int) [][]uint32 {
	rng := rand.New(rand.NewPCG(seed, stringSeed("system "+model)))
	out := make([][]uint32, n)
	for i := range out {
		out[i] = randomTokens(rng, (3+rng.IntN(28))*blockSize+rng.IntN(blockSize))
	}
	return out
}

// Workload generates one engine's requests, deterministic in its random
// source: turns of conversations that each start with one of the shared
// system prompts, and one-shot questions. It is not safe for concurrent
// use.
type Workload struct {
	opts    WorkloadOptions
	rng     *rand.Rand
	systems [][]uint32
	convs   []conversation
}

// conversation is one open conversation.
type conversation struct {
	system, turns, maxTurns int
	history                 []uint32
}

// NewWorkload returns a workload over systems (at least one) drawing from rng.
func NewWorkload(opts WorkloadOptions, systems [][]uint32, rng *rand.Rand) (*Workload, error) {
	if len(systems) == 0 {
		return nil, fmt.Errorf("soak: workload needs at least one system prompt")
	}
	w := &Workload{opts: opts, rng: rng, systems: systems, convs: make([]conversation, opts.Conversations)}
	for i := range w.convs {
		w.convs[i] = w.newConversation()
	}
	return w, nil
}

func (w *Workload) newConversation() conversation {
	return conversation{system: w.rng.IntN(len(w.systems)), maxTurns: 1 + w.rng.IntN(w.opts.MaxTurns)}
}

// Next returns the next request's prompt (a new slice the caller owns).
func (w *Workload) Next() []uint32 {
	if w.rng.Float64() < w.opts.OneShot {
		sys := w.systems[w.rng.IntN(len(w.systems))]
		return append(append([]uint32(nil), sys...), randomTokens(w.rng, 1+w.rng.IntN(w.opts.UserTokens))...)
	}
	c := &w.convs[w.rng.IntN(len(w.convs))]
	sys := w.systems[c.system]
	user := randomTokens(w.rng, 1+w.rng.IntN(w.opts.UserTokens))
	prompt := make([]uint32, 0, len(sys)+len(c.history)+len(user))
	prompt = append(append(append(prompt, sys...), c.history...), user...)
	c.history = append(append(c.history, user...), randomTokens(w.rng, 1+w.rng.IntN(w.opts.ReplyTokens))...)
	c.turns++
	if c.turns >= c.maxTurns || len(sys)+len(c.history) > w.opts.MaxTokens {
		*c = w.newConversation()
	}
	return prompt
}

// randomTokens returns n token ids below 128,000 (a Llama 3 vocabulary).
func randomTokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(rng.IntN(128000))
	}
	return out
}

// stringSeed folds s into a seed (FNV-1a), for random streams named by
// what they generate.
func stringSeed(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}
