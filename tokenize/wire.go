package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// Message is one chat message, as in an OpenAI /v1/chat/completions body
// (the text of its content).
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// WireRequest is the body of a POST to vLLM's /tokenize: a completion
// prompt (Prompt, with AddSpecialTokens, vLLM's default true) or a chat
// (Messages, with AddGenerationPrompt, vLLM's default true; special
// tokens default to false there, since the chat template adds them).
type WireRequest struct {
	Model    string        `json:"model,omitempty"`
	Prompt   string        `json:"prompt,omitempty"`
	Messages []WireMessage `json:"messages,omitempty"`
	// AddSpecialTokens adds the tokenizer's special tokens (BOS); nil
	// means vLLM's default for the kind of prompt.
	AddSpecialTokens *bool `json:"add_special_tokens,omitempty"`
	// AddGenerationPrompt appends the template's assistant header to a
	// chat; nil means true.
	AddGenerationPrompt *bool `json:"add_generation_prompt,omitempty"`
}

// WireMessage is a chat message on the wire. Content is a string or an
// OpenAI list of content parts ({"type":"text","text":...}).
type WireMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// Text returns the message's text: the string content, or the text parts
// of a content list joined by newlines (as vLLM joins them for a
// string-format template). Parts of other types are left out.
func (m *WireMessage) Text() (string, error) {
	c := bytes.TrimSpace(m.Content)
	if len(c) == 0 || string(c) == "null" {
		return "", nil
	}
	if c[0] == '"' {
		if s, ok := unquote(c); ok {
			return s, nil
		}
		var s string
		if err := json.Unmarshal(c, &s); err != nil {
			return "", fmt.Errorf("tokenize: content: %w", err)
		}
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(c, &parts); err != nil {
		return "", fmt.Errorf("tokenize: content is neither a string nor a list of parts: %w", err)
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// TextShared is Text without the copy in the common case: a string
// content without escapes is returned as a string that shares
// m.Content's memory (no allocation), so m.Content must not change while
// the string is in use. Other contents are decoded as Text decodes them.
func (m *WireMessage) TextShared() (string, error) {
	if s, ok := SharedString(bytes.TrimSpace(m.Content)); ok {
		return s, nil
	}
	return m.Text()
}

// SharedString returns the text of a JSON string literal without escapes
// as a string sharing q's memory (no allocation; q must not change while
// the string is in use); ok is false for any other literal (escapes,
// invalid UTF-8, control characters, not a string), which the caller
// decodes otherwise.
func SharedString(q []byte) (string, bool) {
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		return "", false
	}
	in := q[1 : len(q)-1]
	if bytes.IndexByte(in, '\\') >= 0 || bytes.IndexByte(in, '"') >= 0 || !utf8.Valid(in) {
		return "", false
	}
	for _, c := range in {
		if c < 0x20 {
			return "", false
		}
	}
	if len(in) == 0 {
		return "", true
	}
	return unsafe.String(&in[0], len(in)), true
}

// unquote decodes a JSON string literal, ok false when it is not a
// plain valid one (json.Unmarshal then decides). It is the hot path of a
// chat's text: one pass, one allocation, where json.Unmarshal scans the
// literal twice (validation, then decoding).
func unquote(q []byte) (string, bool) {
	if s, ok := SharedString(q); ok {
		return strings.Clone(s), true
	}
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		return "", false
	}
	q = q[1 : len(q)-1]
	out := make([]byte, 0, len(q))
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '"' || c < 0x20:
			return "", false
		case c != '\\':
			out = append(out, c)
			continue
		}
		i++
		if i == len(q) {
			return "", false
		}
		j := strings.IndexByte(`"\/bfnrt`, q[i])
		if j < 0 { // \uXXXX, surrogate pairs: rare, left to json.Unmarshal
			return "", false
		}
		out = append(out, "\"\\/\b\f\n\r\t"[j])
	}
	if !utf8.Valid(out) {
		return "", false
	}
	return string(out), true
}

// WireResponse is vLLM's /tokenize answer; Count is len(Tokens),
// MaxModelLen the model's context length.
type WireResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
}

// WireRender is vLLM's answer to a render endpoint: the generation
// request the prompt would become, of which kvindex reads TokenIDs (the
// chat template applied). RenderChatPath answers one; RenderCompletionPath
// a list, one per prompt.
type WireRender struct {
	RequestID      string          `json:"request_id"`
	TokenIDs       []uint32        `json:"token_ids"`
	Features       json.RawMessage `json:"features"` // multimodal; null for text
	SamplingParams json.RawMessage `json:"sampling_params"`
	Model          string          `json:"model,omitempty"`
	Stream         bool            `json:"stream"`
	CacheSalt      *string         `json:"cache_salt"`
	Priority       int             `json:"priority"`
}

// wireRequest is req's /tokenize (and render) body, as vLLM's generation
// endpoints would tokenize the prompt.
func wireRequest(req *Request) WireRequest {
	w := WireRequest{Model: req.Model}
	if req.Messages == nil {
		w.Prompt = req.Prompt
		t := true
		w.AddSpecialTokens = &t
		return w
	}
	w.Messages = make([]WireMessage, len(req.Messages))
	for i, m := range req.Messages {
		c, _ := json.Marshal(m.Content) // a string always marshals
		w.Messages[i] = WireMessage{Role: m.Role, Content: c}
	}
	t := true
	w.AddGenerationPrompt = &t
	return w
}
