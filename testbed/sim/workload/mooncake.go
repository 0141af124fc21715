package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// MooncakeBlock is the number of tokens behind one Mooncake hash id.
const MooncakeBlock = 512

// mooncakeTag separates Mooncake content ids from generated ones.
const mooncakeTag = 0x6d6f6f6e63616b65 // "mooncake"

// mooncakeLine is one line of a Mooncake trace.
type mooncakeLine struct {
	Timestamp    float64  `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// ReadMooncake reads a trace in the Mooncake format (one JSON object per
// line: timestamp in ms, input_length, output_length, hash_ids of 512-token
// blocks) and names the workload name. Hash id h becomes a segment of 512
// tokens (the last one input_length - 512*(n-1)) whose content is a pure
// function of h, so equal ids give equal tokens at any block size dividing
// 512. An output_length of 0 becomes 1 (an engine always generates one
// token). Lines are stably sorted by timestamp.
func ReadMooncake(r io.Reader, name string) (*Workload, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	w := &Workload{Name: name}
	lineNo := 0
	for sc.Scan() {
		lineNo++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var l mooncakeLine
		if err := json.Unmarshal(b, &l); err != nil {
			return nil, fmt.Errorf("workload: %s line %d: %w (line starts %q)", name, lineNo, err, snippet(b))
		}
		n := len(l.HashIDs)
		switch {
		case l.InputLength <= 0:
			return nil, fmt.Errorf("workload: %s line %d: input_length %d must be positive", name, lineNo, l.InputLength)
		case n == 0:
			return nil, fmt.Errorf("workload: %s line %d: no hash_ids", name, lineNo)
		case l.InputLength > n*MooncakeBlock || l.InputLength <= (n-1)*MooncakeBlock:
			return nil, fmt.Errorf("workload: %s line %d: input_length %d does not fit %d hash_ids of %d tokens", name, lineNo, l.InputLength, n, MooncakeBlock)
		case l.Timestamp < 0 || l.OutputLength < 0:
			return nil, fmt.Errorf("workload: %s line %d: negative timestamp or output_length", name, lineNo)
		}
		segs := make([]Segment, n)
		for i, h := range l.HashIDs {
			segs[i] = Segment{ID: mix64(mooncakeTag ^ h), Len: MooncakeBlock}
		}
		segs[n-1].Len = l.InputLength - (n-1)*MooncakeBlock
		w.Requests = append(w.Requests, Request{
			Arrival:   time.Duration(l.Timestamp * float64(time.Millisecond)),
			Prompt:    segs,
			PromptLen: l.InputLength,
			OutputLen: max(1, l.OutputLength),
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("workload: read %s after line %d: %w", name, lineNo, err)
	}
	if len(w.Requests) == 0 {
		return nil, fmt.Errorf("workload: %s holds no requests", name)
	}
	sort.SliceStable(w.Requests, func(i, j int) bool { return w.Requests[i].Arrival < w.Requests[j].Arrival })
	for i := range w.Requests {
		w.Requests[i].ID = i
	}
	return w, nil
}

// LoadMooncake reads the Mooncake-format trace at path.
func LoadMooncake(path string) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("workload: open trace: %w", err)
	}
	defer f.Close()
	return ReadMooncake(f, strings.TrimSuffix(filepath.Base(path), filepath.Ext(path)))
}

func snippet(b []byte) string {
	if len(b) > 40 {
		b = b[:40]
	}
	return string(b)
}
