package ctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"unicode"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// ParseTokens parses token ids separated by commas and/or whitespace
// ("1,2, 3\n4"), or a JSON array ("[1, 2, 3]"). Each id must fit uint32.
func ParseTokens(s string) ([]uint32, error) {
	trimmed := strings.TrimSpace(s)
	if strings.HasPrefix(trimmed, "[") {
		var tokens []uint32
		if err := json.Unmarshal([]byte(trimmed), &tokens); err != nil {
			return nil, fmt.Errorf("parse tokens as a JSON array of uint32: %w", err)
		}
		return tokens, nil
	}
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
	tokens := make([]uint32, 0, len(fields))
	for i, f := range fields {
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token %d %q: not an integer in [0, %d]", i, snippet(f), uint32(math.MaxUint32))
		}
		tokens = append(tokens, uint32(v))
	}
	return tokens, nil
}

// ReadTokensFile reads and parses a tokens file (see ParseTokens); path "-"
// reads stdin.
func ReadTokensFile(path string, stdin io.Reader) ([]uint32, error) {
	data, err := readFile("--tokens-file", path, stdin, -1)
	if err != nil {
		return nil, err
	}
	tokens, err := ParseTokens(string(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))))
	if err != nil {
		return nil, fmt.Errorf("--tokens-file %s: %w", path, err)
	}
	return tokens, nil
}

// readFile reads path, the value of flag; "-" reads stdin, up to limit+1
// bytes when limit is not negative.
func readFile(flag, path string, stdin io.Reader, limit int64) ([]byte, error) {
	var data []byte
	var err error
	switch {
	case path != "-":
		data, err = os.ReadFile(path)
	case stdin == nil:
		return nil, fmt.Errorf("%s -: no standard input", flag)
	case limit >= 0:
		data, err = io.ReadAll(io.LimitReader(stdin, limit+1))
	default:
		data, err = io.ReadAll(stdin)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return data, nil
}

// ParseWorker parses a worker as kvindexctl prints it, "pod/rank", or a
// bare "pod" for rank 0. The rank follows the last slash.
func ParseWorker(s string) (*kvindexv1.WorkerRef, error) {
	pod, rank := s, "0"
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		pod, rank = s[:i], s[i+1:]
	}
	if pod == "" {
		return nil, fmt.Errorf("worker %q: want pod/rank", s)
	}
	r, err := strconv.ParseUint(rank, 10, 31)
	if err != nil {
		return nil, fmt.Errorf("worker %q: rank %q is not a non-negative integer", s, rank)
	}
	return &kvindexv1.WorkerRef{Pod: pod, DpRank: uint32(r)}, nil
}

// snippet shortens bad input for an error message.
func snippet(s string) string {
	const limit = 24
	if len(s) > limit {
		return s[:limit] + "..."
	}
	return s
}
