package fleet

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/events"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

// TestHistory runs the partial-state rules (see history) through what a
// worker's stream can do: the engine's first batches, a late join, a
// restore and what may follow it, gaps kept or reset by the gap policy,
// engine restarts and clears. Each step gives the batch's seq (or a
// reset) and the partial flag, the reason it was counted under ("" when
// not newly partial) and words of why.
func TestHistory(t *testing.T) {
	const reset = -1
	type step struct {
		seq     int // reset: the subscriber resets the worker
		clear   bool
		partial bool
		became  string
		why     string
	}
	restored := history{seq: 10, hasSeq: true, known: true, restored: true}
	cases := []struct {
		name  string
		start history
		steps []step
	}{
		{"from the engine's start", history{}, []step{{seq: 0}, {seq: 1}, {seq: 2}}},
		{"joined late, no checkpoint", history{}, []step{
			{seq: 5, partial: true, became: reasonNoCheckpoint, why: "batches 0..4 are beyond"},
			{seq: 6, partial: true},
			{seq: 7, clear: true},
			{seq: 8},
		}},
		{"restored, replay in sequence", restored, []step{{seq: 11}, {seq: 12}}},
		{"restored, the buffer moved past the checkpoint (reset policy)", restored, []step{
			{seq: reset},
			{seq: 20, partial: true, became: reasonCheckpointGap, why: "batches 11..19, after the checkpoint's seq 10"},
			{seq: 21, partial: true},
		}},
		{"restored, the buffer moved past the checkpoint (keep policy)", restored, []step{
			{seq: 20, partial: true, became: reasonCheckpointGap, why: "batches 11..19"},
		}},
		{"restored, the engine restarted", restored, []step{{seq: reset}, {seq: 0}, {seq: 1}}},
		{"restored, the engine restarted and its buffer lost its start", restored, []step{
			{seq: reset},
			{seq: 3, partial: true, became: reasonCheckpointGap, why: "restarted after the checkpoint"},
		}},
		{"restored partial, whole at the engine's restart", history{seq: 10, hasSeq: true, known: true, restored: true, partial: true, why: "x"}, []step{
			{seq: 11, partial: true},
			{seq: reset},
			{seq: 0},
		}},
		{"running, a gap beyond replay", history{seq: 10, hasSeq: true, known: true}, []step{
			{seq: reset},
			{seq: 15, partial: true, became: reasonGap, why: "batches 11..14 were lost"},
			{seq: 40, partial: true}, // counted once
			{seq: 41, clear: true},
		}},
		{"running, the engine restarted and its buffer lost its start", history{seq: 10, hasSeq: true, known: true}, []step{
			{seq: reset},
			{seq: 4, partial: true, became: reasonGap, why: "restarted, and its replay buffer starts at seq 4"},
		}},
		{"a clear in the batch that shows a gap", history{}, []step{{seq: 9, clear: true}, {seq: 10}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.start
			for i, st := range tc.steps {
				if st.seq == reset {
					h.hasSeq = false // what agentSink.Reset does
					continue
				}
				b := &events.Batch{Events: []events.Event{{Kind: events.KindBlockRemoved}}}
				if st.clear {
					b.Events = append(b.Events, events.Event{Kind: events.KindAllBlocksCleared})
				}
				became := h.batch(uint64(st.seq), b)
				if h.partial != st.partial || became != st.became || !strings.Contains(h.why, st.why) || (!h.partial && h.why != "") {
					t.Fatalf("step %d (seq %d): partial %v, became %q, why %q; want %v, %q, %q", i, st.seq, h.partial, became, h.why, st.partial, st.became, st.why)
				}
				if h.seq != uint64(st.seq) || !h.hasSeq || h.restored {
					t.Fatalf("step %d: history %+v after seq %d", i, h, st.seq)
				}
			}
		})
	}
}

// TestCheckpointFile checks the file's frame: a checkpoint survives it,
// and every truncation, a flipped bit anywhere, another magic and bytes
// after it are ErrCorruptCheckpoint; and that writeFileAtomic replaces
// the file and leaves no temporary file, and fails in a directory it
// cannot write.
func TestCheckpointFile(t *testing.T) {
	ck := &fleetv1.Checkpoint{Version: checkpointVersion, Pod: "p", Model: "m", KeyScheme: "k", BlockSize: 16, WrittenUnixMs: 1234,
		Workers: []*fleetv1.WorkerCheckpoint{{DpRank: 1, EngineSeq: 99, HasEngineSeq: true, Segments: [][]byte{{1, 2, 3}}, Blocks: 7}}}
	data, err := encodeCheckpointFile(ck)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeCheckpointFile(data)
	if err != nil || !proto.Equal(got, ck) {
		t.Fatalf("decoded %v, %v; want %v", got, err, ck)
	}
	for n := range len(data) {
		if _, err := decodeCheckpointFile(data[:n]); !errors.Is(err, ErrCorruptCheckpoint) {
			t.Fatalf("%d of %d bytes: %v", n, len(data), err)
		}
	}
	for i := range len(data) {
		for bit := range 8 {
			c := append([]byte(nil), data...)
			c[i] ^= 1 << bit
			if _, err := decodeCheckpointFile(c); !errors.Is(err, ErrCorruptCheckpoint) {
				t.Fatalf("bit %d of byte %d flipped: %v", bit, i, err)
			}
		}
	}
	if _, err := decodeCheckpointFile(append(data, 0)); !errors.Is(err, ErrCorruptCheckpoint) {
		t.Fatalf("a byte after it: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "ckpt")
	for _, content := range [][]byte{data, []byte("second")} {
		if err := writeFileAtomic(path, content); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != string(content) {
			t.Fatalf("read back %q, %v", b, err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("directory holds %v, want only the checkpoint", ents)
	}
	if _, err := readCheckpointFile(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing file: %v", err)
	}
	if _, err := readCheckpointFile(path); !errors.Is(err, ErrCorruptCheckpoint) {
		t.Fatalf("a file that is not a checkpoint: %v", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, "missing", "ckpt"), data); err == nil {
		t.Fatal("a write into a missing directory succeeded")
	}
}
