// Package standin is a deterministic stand-in for a vLLM server's
// tokenizer, for tests, benchmarks and simulated engines (kvsim's
// engine): Tokens and Chat implement a fixed scheme, and Handler serves
// them at /tokenize in vLLM's wire format (package tokenize's
// WireRequest and WireResponse). It is not any model's tokenizer; it only
// keeps the properties kvindex relies on: the same text always gives the
// same ids, and a prompt that extends another by whole words (a chat that
// gains a turn) extends its ids.
//
// # The scheme
//
// A prompt is split at white space; each word becomes one id, 256 plus
// its 32-bit FNV-1a hash modulo Vocab-256 (ids below 256 are special).
// With special tokens a prompt starts with BOS. A chat renders each
// message as MsgStart, the role's word id, the content's word ids and
// MsgEnd, all after BOS; the generation prompt appends MsgStart and the id
// of the word "assistant". So turn n+1 of a conversation (its messages
// plus the assistant's answer and a new user message) starts with every
// id of turn n, generation prompt included.
//
// # Concurrency
//
// Everything here is safe for concurrent use.
package standin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"github.com/kvindex/kvindex/internal/tokenize"
)

// Special ids and the vocabulary size of the scheme.
const (
	BOS      = 1
	MsgStart = 2
	MsgEnd   = 3
	Vocab    = 128000
)

// Word returns one word's id.
func Word(w string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(w); i++ {
		h = (h ^ uint32(w[i])) * 16777619
	}
	return 256 + h%(Vocab-256)
}

// appendWords appends the ids of text's words to dst.
func appendWords(dst []uint32, text string) []uint32 {
	for len(text) > 0 {
		i := strings.IndexFunc(text, unicode.IsSpace)
		if i < 0 {
			return append(dst, Word(text))
		}
		if i > 0 {
			dst = append(dst, Word(text[:i]))
		}
		_, n := utf8.DecodeRuneInString(text[i:])
		text = text[i+n:]
	}
	return dst
}

// Tokens tokenizes a completion prompt, BOS first when special is set
// (vLLM's default for /v1/completions).
func Tokens(prompt string, special bool) []uint32 {
	out := make([]uint32, 0, len(prompt)/5+1)
	if special {
		out = append(out, BOS)
	}
	return appendWords(out, prompt)
}

// Chat renders and tokenizes a chat with the scheme's template.
func Chat(msgs []tokenize.Message, generationPrompt bool) []uint32 {
	n := 4
	for _, m := range msgs {
		n += len(m.Content)/5 + 3
	}
	out := append(make([]uint32, 0, n), BOS)
	for _, m := range msgs {
		out = append(out, MsgStart, Word(m.Role))
		out = appendWords(out, m.Content)
		out = append(out, MsgEnd)
	}
	if generationPrompt {
		out = append(out, MsgStart, Word("assistant"))
	}
	return out
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
	case render && h.NoRender:
		h.missing.Add(1)
		// What the web framework of a server without the route answers.
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		return
	case !render && r.URL.Path != tokenize.TokenizePath:
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
	if len(h.Models) > 0 && !contains(h.Models, req.Model) {
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
	if maxLen == 0 {
		maxLen = 131072
	}
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

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
