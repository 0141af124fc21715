package vllmsim

import (
	"strings"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/internal/sim/workload"
)

// bytesPerToken is the simulated tokenizer's rate, about that of Llama 3's
// on English text.
const bytesPerToken = 4

// Message is one chat message.
type Message struct {
	// Role is system, user or assistant.
	Role string `json:"role"`
	// Content is the message's text.
	Content string `json:"content"`
}

// Tokenize cuts a completion prompt into pieces at blank lines ("\n\n")
// and returns one segment per piece (see the package doc).
func Tokenize(prompt string) []workload.Segment {
	var segs []workload.Segment
	for piece := range strings.SplitSeq(prompt, "\n\n") {
		if piece != "" {
			segs = append(segs, segment("text", piece))
		}
	}
	return segs
}

// TokenizeChat returns one segment per message, its role included in its
// content hash.
func TokenizeChat(msgs []Message) []workload.Segment {
	segs := make([]workload.Segment, 0, len(msgs))
	for _, m := range msgs {
		segs = append(segs, segment(m.Role, m.Content))
	}
	return segs
}

// segment is the run of tokens of one piece of text.
func segment(role, text string) workload.Segment {
	return workload.Segment{ID: xxh3.HashString(role + "\x00" + text), Len: max(1, (len(text)+bytesPerToken-1)/bytesPerToken)}
}

// Tokens returns the token ids of segs, as the engine's KV events carry
// them.
func Tokens(segs []workload.Segment) []uint32 {
	r := workload.Request{Prompt: segs}
	n := 0
	for _, s := range segs {
		n += s.Len
	}
	return r.AppendTokens(make([]uint32, 0, n), 0, n)
}
