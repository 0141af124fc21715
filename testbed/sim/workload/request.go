package workload

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvindex/kvindex/tokenize/standin"
)

// Vocab is the token-id range of derived tokens: the stand-in
// tokenizer's, whose token scheme the simulator shares.
const Vocab = standin.Vocab

// Segment is a run of Len tokens named by ID: token i is Token(ID, i).
type Segment = standin.Segment

// Request is one inference request to replay.
type Request struct {
	// ID is the request's index in its workload.
	ID int
	// Arrival is from the start of the workload.
	Arrival time.Duration
	Prompt  []Segment
	// PromptLen is the sum of the segments' lengths; OutputLen >= 1 the
	// tokens generated.
	PromptLen, OutputLen int
	// Group names what the request shares with others (a tenant, a
	// prefix), or "".
	Group string
}

// Workload is a named list of requests sorted by Arrival, Requests[i].ID
// == i, designed for a fleet of Engines (0: no opinion).
type Workload struct {
	Name     string
	Requests []Request
	Engines  int
}

// Token returns token off of the content named id (a pure function).
func Token(id uint64, off int) uint32 { return standin.Token(id, off) }

const outputTag = 0x6f75747075740000 // "output\0\0"

// OutputSegment is the content the request generates, unique to it:
// cached as vLLM caches it, never matched by another request (a later
// turn repeating an answer names it with its own prompt ids).
func (r *Request) OutputSegment(workloadSeed uint64) Segment {
	return Segment{ID: Mix64(outputTag ^ workloadSeed ^ uint64(r.ID)*0xbf58476d1ce4e5b9), Len: r.OutputLen}
}

// AppendTokens appends the prompt's tokens [start, end) to dst (one mix,
// about 1 ns, a token).
func (r *Request) AppendTokens(dst []uint32, start, end int) []uint32 {
	return standin.AppendTokens(dst, r.Prompt, start, end)
}

// AppendSequenceTokens is AppendTokens over the prompt followed by out
// (the request's OutputSegment), for blocks that hold generated tokens.
func (r *Request) AppendSequenceTokens(dst []uint32, out Segment, start, end int) []uint32 {
	if end <= r.PromptLen {
		return standin.AppendTokens(dst, r.Prompt, start, end)
	}
	if start < r.PromptLen {
		dst = standin.AppendTokens(dst, r.Prompt, start, r.PromptLen)
		start = r.PromptLen
	}
	for i := start - r.PromptLen; i < end-r.PromptLen; i++ {
		dst = append(dst, Token(out.ID, i))
	}
	return dst
}

const blockSeed = 0x243f6a8885a308d3

// AppendBlockContent appends one content id per full block of blockSize
// tokens of the prompt followed by out (Segment{}: the prompt alone),
// hashing the block's pieces (segment id, offset, length): ids are equal
// exactly when the tokens are. Not chained. Cost: O(blocks + segments)
// mixes, no token generated.
func (r *Request) AppendBlockContent(dst []uint64, blockSize int, out Segment) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	h := uint64(blockSeed)
	need := blockSize
	add := func(s Segment) {
		for off := 0; off < s.Len; {
			take := min(need, s.Len-off)
			h = Mix64(h ^ Mix64(s.ID^Mix64(uint64(off)<<32|uint64(take))))
			off += take
			need -= take
			if need == 0 {
				dst = append(dst, h)
				h, need = blockSeed, blockSize
			}
		}
	}
	for _, s := range r.Prompt {
		add(s)
	}
	if out.Len > 0 {
		add(out)
	}
	return dst
}

// Validate checks the invariants the simulator relies on.
func (w *Workload) Validate() error {
	var last time.Duration
	for i := range w.Requests {
		r := &w.Requests[i]
		if r.ID != i {
			return fmt.Errorf("workload %s: request %d has id %d", w.Name, i, r.ID)
		}
		if r.Arrival < last {
			return fmt.Errorf("workload %s: request %d arrives at %v, before request %d at %v", w.Name, i, r.Arrival, i-1, last)
		}
		last = r.Arrival
		n := 0
		for _, s := range r.Prompt {
			if s.Len <= 0 {
				return fmt.Errorf("workload %s: request %d has an empty segment", w.Name, i)
			}
			n += s.Len
		}
		if n != r.PromptLen || n == 0 {
			return fmt.Errorf("workload %s: request %d has prompt length %d but segments of %d tokens", w.Name, i, r.PromptLen, n)
		}
		if r.OutputLen < 1 {
			return fmt.Errorf("workload %s: request %d generates %d tokens (want >= 1)", w.Name, i, r.OutputLen)
		}
	}
	return nil
}

// Head returns a workload of the first n requests (n <= 0: all).
func (w *Workload) Head(n int) *Workload {
	out := *w
	if n > 0 && n < len(w.Requests) {
		out.Requests = w.Requests[:n]
	}
	return &out
}

// Scale returns a copy whose arrivals are divided by factor (2: twice the
// rate), sharing prompts.
func (w *Workload) Scale(factor float64) *Workload {
	out := *w
	out.Requests = make([]Request, len(w.Requests))
	for i, r := range w.Requests {
		r.Arrival = time.Duration(float64(r.Arrival) / factor)
		out.Requests[i] = r
	}
	return &out
}

// Pause returns a copy in which requests from index from on arrive d
// later (a sparse start), sharing prompts.
func (w *Workload) Pause(from int, d time.Duration) *Workload {
	out := *w
	out.Requests = slices.Clone(w.Requests)
	for i := max(from, 0); i < len(out.Requests); i++ {
		out.Requests[i].Arrival += d
	}
	return &out
}

// Stats are a workload's totals.
type Stats struct {
	Requests                   int
	PromptTokens, OutputTokens int64
	Duration                   time.Duration
}

// Stats returns the workload's totals.
func (w *Workload) Stats() Stats {
	s := Stats{Requests: len(w.Requests)}
	for i := range w.Requests {
		s.PromptTokens += int64(w.Requests[i].PromptLen)
		s.OutputTokens += int64(w.Requests[i].OutputLen)
	}
	if n := len(w.Requests); n > 0 {
		s.Duration = w.Requests[n-1].Arrival - w.Requests[0].Arrival
	}
	return s
}

// Mix64 is the simulator's one mixing function (SplitMix64's finaliser).
func Mix64(x uint64) uint64 { return standin.Mix64(x) }
