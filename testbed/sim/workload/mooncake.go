package workload

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	w := &Workload{Name: name}
	err := eachLine(r, name, func(_ int, b []byte) error {
		var l mooncakeLine
		if err := json.Unmarshal(b, &l); err != nil {
			return fmt.Errorf("%w (line starts %q)", err, snippet(b))
		}
		n := len(l.HashIDs)
		switch {
		case l.InputLength <= 0:
			return fmt.Errorf("input_length %d must be positive", l.InputLength)
		case n == 0:
			return fmt.Errorf("no hash_ids")
		case l.InputLength > n*MooncakeBlock || l.InputLength <= (n-1)*MooncakeBlock:
			return fmt.Errorf("input_length %d does not fit %d hash_ids of %d tokens", l.InputLength, n, MooncakeBlock)
		case l.Timestamp < 0 || l.OutputLength < 0:
			return fmt.Errorf("negative timestamp or output_length")
		}
		segs := make([]Segment, n)
		for i, h := range l.HashIDs {
			segs[i] = Segment{ID: Mix64(mooncakeTag ^ h), Len: MooncakeBlock}
		}
		segs[n-1].Len = l.InputLength - (n-1)*MooncakeBlock
		w.Requests = append(w.Requests, Request{
			Arrival:   time.Duration(l.Timestamp * float64(time.Millisecond)),
			Prompt:    segs,
			PromptLen: l.InputLength,
			OutputLen: max(1, l.OutputLength),
		})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return finish(w)
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
