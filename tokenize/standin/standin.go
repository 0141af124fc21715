// Package standin is kvindex's deterministic stand-in for a vLLM server's
// tokenizer, for tests and simulated engines: Pieces and ChatPieces cut a
// prompt into runs of tokens, Tokens and Chat give their ids, and Handler
// serves them in vLLM's wire format. It keeps only the properties kvindex
// relies on: the same text gives the same ids, and a prompt that extends
// another by whole pieces extends its ids.
//
// # The scheme
//
// Text becomes Segment runs (the simulator's unit of content too), so
// that a simulated engine holds a prompt as a few segments and its KV
// events carry exactly the ids Tokens and Chat return: token i of a
// segment is Token(its id, i). A segment of text has one token
// per BytesPerToken bytes (at least one), about Llama 3's rate on English,
// and its id is a hash of its kind and text.
//
// A completion prompt is cut at blank lines ("\n\n"), each paragraph one
// segment; with special tokens (vLLM's default for /v1/completions) a
// one-token BOS segment comes first. A chat renders BOS, then for each
// message a one-token header naming its role and a segment of its content
// (none for empty content); the generation prompt appends the header of
// "assistant". So turn n+1 of a conversation (its messages plus the
// assistant's answer and a new user message) starts with every id of turn
// n, generation prompt included. Everything here is safe for concurrent
// use.
package standin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/tokenize"
)

// BytesPerToken is the scheme's rate: a segment of text of n bytes has
// ceil(n/BytesPerToken) tokens.
const BytesPerToken = 4

// The ids of the scheme's one-token segments.
const (
	bosID    = 0x626f730000000001 // "bos"
	headerID = 0x6864720000000000 // "hdr", mixed with the role's hash
)

// BOS is the id of the begin-of-sequence token.
func BOS() uint32 { return Token(bosID, 0) }

// Header is the id of the header token of a message by role.
func Header(role string) uint32 { return Token(headerID^xxh3.HashString(role), 0) }

// text is the segment of one piece of text of kind (a paragraph's "text",
// a message's role).
func text(kind, s string) Segment {
	return Segment{ID: xxh3.HashString(kind + "\x00" + s), Len: max(1, (len(s)+BytesPerToken-1)/BytesPerToken)}
}

// Pieces cuts a completion prompt into its segments: BOS when special is
// set, then one per paragraph.
func Pieces(prompt string, special bool) []Segment {
	segs := make([]Segment, 0, strings.Count(prompt, "\n\n")+2)
	if special {
		segs = append(segs, Segment{ID: bosID, Len: 1})
	}
	for piece := range strings.SplitSeq(prompt, "\n\n") {
		if piece != "" {
			segs = append(segs, text("text", piece))
		}
	}
	return segs
}

// ChatPieces renders a chat into its segments with the scheme's template.
func ChatPieces(msgs []tokenize.Message, generationPrompt bool) []Segment {
	segs := make([]Segment, 0, 2*len(msgs)+2)
	segs = append(segs, Segment{ID: bosID, Len: 1})
	for _, m := range msgs {
		segs = append(segs, Segment{ID: headerID ^ xxh3.HashString(m.Role), Len: 1})
		if m.Content != "" {
			segs = append(segs, text(m.Role, m.Content))
		}
	}
	if generationPrompt {
		segs = append(segs, Segment{ID: headerID ^ xxh3.HashString("assistant"), Len: 1})
	}
	return segs
}

// Expand returns the token ids of segs.
func Expand(segs []Segment) []uint32 {
	n := 0
	for _, s := range segs {
		n += s.Len
	}
	return AppendTokens(make([]uint32, 0, n), segs, 0, n)
}

// Tokens tokenizes a completion prompt, BOS first when special is set
// (vLLM's default for /v1/completions).
func Tokens(prompt string, special bool) []uint32 { return Expand(Pieces(prompt, special)) }

// Chat renders and tokenizes a chat with the scheme's template.
func Chat(msgs []tokenize.Message, generationPrompt bool) []uint32 {
	return Expand(ChatPieces(msgs, generationPrompt))
}

// MaxBodyBytes bounds a request body the Handler reads.
const MaxBodyBytes = 16 << 20

// Handler serves vLLM's tokenizing endpoints with the scheme, in vLLM's
// wire format: POST /tokenize (tokenize.WireRequest in,
// tokenize.WireResponse out) and, unless NoRender, the render endpoints
// (tokenize.RenderChatPath answers one tokenize.WireRender,
// tokenize.RenderCompletionPath a list of one). The zero value is usable.
type Handler struct {
	// MaxModelLen is the context length answered, and the most ids a
	// prompt may have (a longer one is refused with 400, as vLLM does);
	// 0 means 131072.
	MaxModelLen int
	// Models, when not empty, are the model names served; others get
	// vLLM's 404 error object.
	Models []string
	// NoRender answers the render endpoints as an older vLLM does: 404,
	// no such route.
	NoRender bool

	requests, renders, missing atomic.Int64
}

// Requests counts the requests answered with tokens, at any endpoint.
func (h *Handler) Requests() int64 { return h.requests.Load() }

// Renders counts the requests answered with tokens at a render endpoint.
func (h *Handler) Renders() int64 { return h.renders.Load() }

// RenderMisses counts render requests answered 404 because of NoRender.
func (h *Handler) RenderMisses() int64 { return h.missing.Load() }

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	render := r.URL.Path == tokenize.RenderChatPath || r.URL.Path == tokenize.RenderCompletionPath
	switch {
	case render && h.NoRender, !render && r.URL.Path != tokenize.TokenizePath:
		if render {
			h.missing.Add(1)
		}
		// What the web framework of a server without the route answers.
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		return
	case r.Method != http.MethodPost:
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil || len(body) > MaxBodyBytes {
		http.Error(w, "body unreadable or over the limit", http.StatusRequestEntityTooLarge)
		return
	}
	var req tokenize.WireRequest
	if err := json.Unmarshal(body, &req); err != nil {
		badRequest(w, fmt.Sprintf("invalid JSON: %v", err))
		return
	}
	if len(h.Models) > 0 && !slices.Contains(h.Models, req.Model) {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{"message": fmt.Sprintf("The model `%s` does not exist.", req.Model), "type": "NotFoundError", "param": "model", "code": 404}})
		return
	}
	chat := req.Messages != nil
	if render && chat != (r.URL.Path == tokenize.RenderChatPath) {
		badRequest(w, "a chat renders at "+tokenize.RenderChatPath+", a prompt at "+tokenize.RenderCompletionPath)
		return
	}
	var toks []uint32
	if chat {
		msgs := make([]tokenize.Message, len(req.Messages))
		for i := range req.Messages {
			text, err := req.Messages[i].Text()
			if err != nil {
				badRequest(w, fmt.Sprintf("messages[%d]: %v", i, err))
				return
			}
			msgs[i] = tokenize.Message{Role: req.Messages[i].Role, Content: text}
		}
		toks = Chat(msgs, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
		// The template starts with BOS; special tokens (off by default
		// for a chat, as in vLLM) add a second one.
		if req.AddSpecialTokens != nil && *req.AddSpecialTokens {
			toks = append(Tokens("", true), toks...)
		}
	} else {
		toks = Tokens(req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	}
	maxLen := h.MaxModelLen
	defaults.Zero(&maxLen, 131072)
	if len(toks) > maxLen {
		badRequest(w, fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens.", maxLen, len(toks)))
		return
	}
	n := h.requests.Add(1)
	if !render {
		writeJSON(w, http.StatusOK, tokenize.WireResponse{Count: len(toks), MaxModelLen: maxLen, Tokens: toks})
		return
	}
	h.renders.Add(1)
	out := tokenize.WireRender{RequestID: fmt.Sprintf("standin-%d", n), TokenIDs: toks, Features: json.RawMessage("null"),
		SamplingParams: json.RawMessage(`{"n":1,"temperature":1.0,"top_p":1.0,"max_tokens":null}`), Model: req.Model}
	if chat {
		writeJSON(w, http.StatusOK, out)
		return
	}
	writeJSON(w, http.StatusOK, []tokenize.WireRender{out})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func badRequest(w http.ResponseWriter, msg string) {
	writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{"message": msg, "type": "BadRequestError", "code": 400}})
}
