package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// logBlock is the token run one segment of a logged prompt covers, so
// prompts sharing real tokens share block content at any block size that
// divides it (16, vLLM's default, 8, ...).
const logBlock = 16

const logTag = 0x6c6f67676564 // "logged"

// DefaultLogOutputTokens is a logged request's output length when it
// gives none.
const DefaultLogOutputTokens = 128

type tokenLine struct {
	Timestamp    float64  `json:"timestamp"`
	TokenIDs     []uint32 `json:"token_ids"`
	OutputLength int      `json:"output_length"`
}

// FromTokens is a request whose prompt is tokens: a segment per 16
// tokens, named by the chained hash of every token up to its end, so
// prompts share segments as far as they share tokens (in whole runs).
func FromTokens(arrival time.Duration, tokens []uint32, outputLen int) Request {
	segs := make([]Segment, 0, (len(tokens)+logBlock-1)/logBlock)
	h := uint64(logTag)
	for off := 0; off < len(tokens); off += logBlock {
		end := min(off+logBlock, len(tokens))
		for _, t := range tokens[off:end] {
			h = Mix64(h ^ uint64(t))
		}
		// A partial tail is named by its length too: never a full run.
		segs = append(segs, Segment{ID: Mix64(h ^ uint64(end-off)<<48), Len: end - off})
	}
	if outputLen <= 0 {
		outputLen = DefaultLogOutputTokens
	}
	return Request{Arrival: arrival, Prompt: segs, PromptLen: len(tokens), OutputLen: outputLen}
}

// ReadTokenLog reads a request log of token ids, a JSON object a line:
// {"timestamp": ms, "token_ids": [...], "output_length": n (optional)},
// stably sorted by timestamp.
func ReadTokenLog(r io.Reader, name string) (*Workload, error) {
	w := &Workload{Name: name}
	err := eachLine(r, name, func(lineNo int, b []byte) error {
		var l tokenLine
		if err := json.Unmarshal(b, &l); err != nil {
			return fmt.Errorf("%w (line starts %q)", err, snippet(b))
		}
		if len(l.TokenIDs) == 0 || l.Timestamp < 0 || l.OutputLength < 0 {
			return fmt.Errorf("want token_ids, a timestamp >= 0 and an output_length >= 0 (line starts %q)", snippet(b))
		}
		w.Requests = append(w.Requests, FromTokens(time.Duration(l.Timestamp*float64(time.Millisecond)), l.TokenIDs, l.OutputLength))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return finish(w)
}

// Tokenizer turns an OpenAI request body (prompt or messages) into token
// ids: vLLM's /tokenize endpoint, or EstimateTokens.
type Tokenizer func(body json.RawMessage) ([]uint32, error)

// openAILine is what ReadOpenAILog reads of a request body.
type openAILine struct {
	Timestamp           float64 `json:"timestamp"`
	MaxTokens           int     `json:"max_tokens"`
	MaxCompletionTokens int     `json:"max_completion_tokens"` // MaxTokens' newer name
}

// ReadOpenAILog reads a log of OpenAI request bodies, a JSON object a
// line (prompt or messages), tokenized by tok, arriving at "timestamp" ms
// (else one a second, in order), generating max_tokens (or
// max_completion_tokens, else DefaultLogOutputTokens).
func ReadOpenAILog(r io.Reader, name string, tok Tokenizer) (*Workload, error) {
	w := &Workload{Name: name}
	n := 0
	err := eachLine(r, name, func(lineNo int, b []byte) error {
		var l openAILine
		if err := json.Unmarshal(b, &l); err != nil {
			return fmt.Errorf("%w (line starts %q)", err, snippet(b))
		}
		ids, err := tok(json.RawMessage(b))
		if err != nil {
			return fmt.Errorf("tokenize: %w", err)
		}
		if len(ids) == 0 {
			return fmt.Errorf("no prompt tokens (line starts %q)", snippet(b))
		}
		at := time.Duration(l.Timestamp * float64(time.Millisecond))
		if l.Timestamp == 0 {
			at = time.Duration(n) * time.Second
		}
		n++
		w.Requests = append(w.Requests, FromTokens(at, ids, max(l.MaxTokens, l.MaxCompletionTokens)))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return finish(w)
}

// EstimateTokens is the Tokenizer without a vLLM endpoint: the prompt's
// text (chat messages as "role: content\n") in 4-character pieces, each
// hashed to a token id. English averages about 4 characters a token in
// Llama 3's tokenizer, and prompts share estimated tokens as far as they
// share text, to the piece: the reuse a real tokenizer finds.
func EstimateTokens(body json.RawMessage) ([]uint32, error) {
	text, err := promptText(body)
	if err != nil {
		return nil, err
	}
	ids := make([]uint32, 0, len(text)/4+1)
	for off := 0; off < len(text); off += 4 {
		piece := text[off:min(off+4, len(text))]
		h := uint64(0x746f6b)
		for i := 0; i < len(piece); i++ {
			h = Mix64(h ^ uint64(piece[i]))
		}
		ids = append(ids, uint32(h%Vocab))
	}
	return ids, nil
}

// promptText is a body's "prompt" (a string, or a list's first) or its
// "messages" as "role: content\n" lines.
func promptText(body json.RawMessage) (string, error) {
	var b struct {
		Prompt   json.RawMessage `json:"prompt"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return "", fmt.Errorf("request body: %w", err)
	}
	if len(b.Prompt) > 0 {
		var s string
		if json.Unmarshal(b.Prompt, &s) == nil {
			return s, nil
		}
		var ss []string
		if json.Unmarshal(b.Prompt, &ss) == nil && len(ss) > 0 {
			return ss[0], nil
		}
		return "", fmt.Errorf("request body: prompt %q is neither a string nor a list of strings", snippet(b.Prompt))
	}
	var sb strings.Builder
	for _, m := range b.Messages {
		sb.WriteString(m.Role)
		sb.WriteString(": ")
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			sb.WriteString(s)
		} else {
			sb.Write(m.Content) // structured content: its JSON, verbatim
		}
		sb.WriteByte('\n')
	}
	if sb.Len() == 0 {
		return "", fmt.Errorf("request body has neither prompt nor messages")
	}
	return sb.String(), nil
}

// eachLine calls fn with every non-empty line of r, wrapping its error
// with the log's name and the line number (from 1).
func eachLine(r io.Reader, name string, fn func(lineNo int, b []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if err := fn(lineNo, b); err != nil {
			return fmt.Errorf("workload: %s line %d: %w", name, lineNo, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("workload: read %s after line %d: %w", name, lineNo, err)
	}
	return nil
}

// finish sorts a read log by arrival and numbers it.
func finish(w *Workload) (*Workload, error) {
	if len(w.Requests) == 0 {
		return nil, fmt.Errorf("workload: %s holds no requests", w.Name)
	}
	sort.SliceStable(w.Requests, func(i, j int) bool { return w.Requests[i].Arrival < w.Requests[j].Arrival })
	for i := range w.Requests {
		w.Requests[i].ID = i
	}
	return w, nil
}
