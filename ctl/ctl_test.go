package ctl_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kvindex/kvindex/ctl"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

func TestParseTokens(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []uint32
	}{
		{"1,2,3", []uint32{1, 2, 3}},
		{" 1, 2 ,3\n4\t5 ", []uint32{1, 2, 3, 4, 5}},
		{"1,,2", []uint32{1, 2}},
		{"[1, 2, 4294967295]", []uint32{1, 2, 4294967295}},
		{"\n [7]\n", []uint32{7}},
		{"", []uint32{}},
	} {
		got, err := ctl.ParseTokens(tc.in)
		if err != nil {
			t.Errorf("ParseTokens(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseTokens(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"1,x,3", `token 1 "x"`},
		{"1 -2", `token 1 "-2"`},
		{"4294967296", `token 0 "4294967296"`},
		{"[1, -2]", "JSON array"},
		{"[1, 2", "JSON array"},
	} {
		_, err := ctl.ParseTokens(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseTokens(%q) error %v, want one mentioning %q", tc.in, err, tc.want)
		}
	}
}

func TestReadTokensFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "prompt.json")
	if err := os.WriteFile(path, []byte("[10, 20,\n 30]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ctl.ReadTokensFile(path, nil)
	if err != nil || !reflect.DeepEqual(got, []uint32{10, 20, 30}) {
		t.Errorf("ReadTokensFile(json) = %v, %v", got, err)
	}
	got, err = ctl.ReadTokensFile("-", strings.NewReader("5 6\n7,8\n"))
	if err != nil || !reflect.DeepEqual(got, []uint32{5, 6, 7, 8}) {
		t.Errorf("ReadTokensFile(-) = %v, %v", got, err)
	}
	_, err = ctl.ReadTokensFile(filepath.Join(dir, "missing"), nil)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("ReadTokensFile(missing) error %v, want ErrNotExist naming the file", err)
	}
}

func TestParseWorker(t *testing.T) {
	for in, want := range map[string]*kvindexv1.WorkerRef{
		"pod-a/3":          {Pod: "pod-a", DpRank: 3},
		"pod-a":            {Pod: "pod-a"},
		"ns/pod-a/1":       {Pod: "ns/pod-a", DpRank: 1},
		"10.0.0.1:5557/0":  {Pod: "10.0.0.1:5557"},
		"tcp://h:5557/2":   {Pod: "tcp://h:5557", DpRank: 2},
		"pod-b/0000000001": {Pod: "pod-b", DpRank: 1},
	} {
		got, err := ctl.ParseWorker(in)
		if err != nil || got.GetPod() != want.GetPod() || got.GetDpRank() != want.GetDpRank() {
			t.Errorf("ParseWorker(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/1", "pod/x", "pod/-1", "pod/"} {
		if _, err := ctl.ParseWorker(in); err == nil {
			t.Errorf("ParseWorker(%q) succeeded", in)
		}
	}
}

func TestScoreArgsRequest(t *testing.T) {
	req, err := ctl.ScoreArgs{PromptArgs: ctl.PromptArgs{Model: "m", Tokens: "1,2", LoRA: "l", CacheSalt: "s"}, Workers: []string{"a/1", "b"}}.Request(nil)
	if err != nil {
		t.Fatal(err)
	}
	if req.GetModel() != "m" || len(req.GetTokenIds()) != 2 || req.GetLoraName() != "l" || req.GetCacheSalt() != "s" ||
		len(req.GetWorkers()) != 2 || req.GetWorkers()[1].GetPod() != "b" {
		t.Errorf("request %v", req)
	}
	for _, tc := range []struct {
		args ctl.ScoreArgs
		want string
	}{
		{ctl.ScoreArgs{PromptArgs: ctl.PromptArgs{Model: "m"}}, "--tokens or --tokens-file: required"},
		{ctl.ScoreArgs{PromptArgs: ctl.PromptArgs{Model: "m", Tokens: "1", TokensFile: "f"}}, "--tokens, --tokens-file: give exactly one"},
		{ctl.ScoreArgs{PromptArgs: ctl.PromptArgs{Model: "m", Tokens: "1", Prompt: "hi"}}, "--tokens, --tokens-file, --prompt, --messages-file: give exactly one"},
		{ctl.ScoreArgs{PromptArgs: ctl.PromptArgs{Model: "m", MessagesFile: "/nonexistent/chat.json"}}, "--messages-file /nonexistent/chat.json: open"},
		{ctl.ScoreArgs{PromptArgs: ctl.PromptArgs{Model: "m", Tokens: " , "}}, "no tokens"},
		{ctl.ScoreArgs{PromptArgs: ctl.PromptArgs{Model: "m", Tokens: "1"}, Workers: []string{"p/x"}}, "--worker"},
	} {
		if _, err := tc.args.Request(nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Hour:                  "in the future",
		-500 * time.Millisecond:     "just now",
		0:                           "just now",
		3 * time.Second:             "3s ago",
		59 * time.Second:            "59s ago",
		4*time.Minute + time.Second: "4m ago",
		2 * time.Hour:               "2h ago",
		72 * time.Hour:              "3d ago",
	} {
		if got := ctl.Age(d); got != want {
			t.Errorf("Age(%v) = %q, want %q", d, got, want)
		}
	}
}

// lines splits output into lines with runs of spaces collapsed, so that
// tests do not depend on column widths.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		out = append(out, strings.Join(strings.Fields(l), " "))
	}
	return out
}

func TestRenderWorkers(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	resp := &kvindexv1.ListWorkersResponse{Workers: []*kvindexv1.WorkerStatus{
		{
			Worker: &kvindexv1.WorkerRef{Pod: "pod-a", DpRank: 0}, Model: "llama", Endpoint: "tcp://10.0.0.1:5557",
			HasSeq: true, LastSeq: 1234, LastEventTime: timestamppb.New(now.Add(-3 * time.Second)),
			ResidentBlocks: 120, ResidentByMedium: []*kvindexv1.MediumCount{{Medium: "GPU", Blocks: 100}, {Medium: "CPU", Blocks: 40}},
			Gaps: 2, Restarts: 1, DecodeErrors: 1, ApplyErrors: 2, Orphans: 5, LastError: "bad msgpack",
			Health: kvindexv1.WorkerHealth_WORKER_HEALTH_STALE, StaleSince: timestamppb.New(now.Add(-12 * time.Second)),
			UnrecoveredGaps: 1, ReplayEndpoint: "tcp://10.0.0.1:5567", Replays: 3, ReplayedBatches: 14, ReplayFailures: 1,
			Clears: 4, JoinedAtSeq: 90, Digest: 0x00ab_cdef_0123_4567, HasDigest: true,
		},
		{
			Worker: &kvindexv1.WorkerRef{Pod: "pod-b", DpRank: 1}, Model: "llama", Endpoint: "tcp://10.0.0.2:5557",
			ResidentBlocks: 7, ResidentByMedium: []*kvindexv1.MediumCount{{Medium: "GPU", Blocks: 7}},
			Health:        kvindexv1.WorkerHealth_WORKER_HEALTH_OK,
			UnknownEvents: 3, LastUnknownEvent: "FutureEvent", UnknownMediumEvents: 9, UnknownMedia: []string{"ZZZ", "CPU_TIER3"},
		},
	}}
	var buf bytes.Buffer
	if err := ctl.RenderWorkers(&buf, resp, now); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"WORKER MODEL ENDPOINT HEALTH SEQ LAST EVENT RESIDENT GAPS REPLAYS RESTARTS CLEARS ERRORS ORPHANS DIGEST",
		"pod-a/0 llama tcp://10.0.0.1:5557 STALE 12s 1234 3s ago 120 (GPU 100, CPU 40) 2 (1 lost) 3/14 (1 failed) 1 4 3 5 00abcdef01234567",
		"pod-b/1 llama tcp://10.0.0.2:5557 OK - never 7 0 - 0 0 0 0 -",
		"pod-a/0: joined late at seq 90: blocks stored before it are unknown",
		"pod-a/0: last error: bad msgpack",
		`pod-b/1: 3 events of an unknown type skipped (last "FutureEvent"); the rest of their batches applied`,
		"pod-b/1: 9 events name media kvindex does not know (ZZZ, CPU_TIER3): held as scoring.unknown_tier; map them with scoring.tier_names",
	}
	if got := lines(buf.String()); !reflect.DeepEqual(got, want) {
		t.Errorf("RenderWorkers:\n%s\nwant rows:\n%s", buf.String(), strings.Join(want, "\n"))
	}
	// Columns line up: every row starts its ENDPOINT at the same offset.
	rows := strings.Split(buf.String(), "\n")
	col := strings.Index(rows[0], "ENDPOINT")
	for _, r := range rows[1:3] {
		if !strings.HasPrefix(r[col:], "tcp://") {
			t.Errorf("row %q: ENDPOINT not at column %d", r, col)
		}
	}

	buf.Reset()
	if err := ctl.RenderWorkers(&buf, &kvindexv1.ListWorkersResponse{}, now); err != nil || buf.String() != "no workers\n" {
		t.Errorf("RenderWorkers(empty) = %q, %v", buf.String(), err)
	}
}

func TestRenderScore(t *testing.T) {
	req := &kvindexv1.ScoreRequest{Model: "llama", TokenIds: make([]uint32, 130)}
	resp := &kvindexv1.ScoreResponse{BlockSize: 16, PromptBlocks: 8, Workers: []*kvindexv1.WorkerScore{
		{Worker: &kvindexv1.WorkerRef{Pod: "pod-a"}, MatchedBlocks: 6, MatchedTokens: 96, ByMedium: []*kvindexv1.MediumMatch{
			{Medium: "GPU", Blocks: 4, Tokens: 64}, {Medium: "CPU", Blocks: 6, Tokens: 96}}},
		{Worker: &kvindexv1.WorkerRef{Pod: "pod-b", DpRank: 1}, MatchedBlocks: 4, MatchedTokens: 64, ByMedium: []*kvindexv1.MediumMatch{
			{Medium: "GPU", Blocks: 4, Tokens: 64}}},
		{Worker: &kvindexv1.WorkerRef{Pod: "pod-c"}},
	}}
	var buf bytes.Buffer
	if err := ctl.RenderScore(&buf, req, resp); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"model: llama",
		"block size: 16 tokens",
		"prompt blocks: 8 (128 of 130 tokens in full blocks)",
		"",
		"WORKER MATCHED BLOCKS MATCHED TOKENS % OF PROMPT BY MEDIUM",
		"pod-a/0 6 96 75.0% GPU 4, CPU 6",
		"pod-b/1 4 64 50.0% GPU 4",
		"pod-c/0 0 0 0.0% -",
	}
	if got := lines(buf.String()); !reflect.DeepEqual(got, want) {
		t.Errorf("RenderScore:\n%s\nwant rows:\n%s", buf.String(), strings.Join(want, "\n"))
	}

	buf.Reset()
	if err := ctl.RenderScore(&buf, req, &kvindexv1.ScoreResponse{BlockSize: 16, PromptBlocks: 8}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "no worker holds the first block of this prompt") {
		t.Errorf("RenderScore(no workers):\n%s", buf.String())
	}
}

func TestWriteJSON(t *testing.T) {
	var buf bytes.Buffer
	resp := &kvindexv1.ScoreResponse{BlockSize: 16, PromptBlocks: 2, Workers: []*kvindexv1.WorkerScore{
		{Worker: &kvindexv1.WorkerRef{Pod: "pod-a"}}}}
	if err := ctl.WriteJSON(&buf, resp); err != nil {
		t.Fatal(err)
	}
	var got struct {
		BlockSize    int `json:"blockSize"`
		PromptBlocks int `json:"promptBlocks"`
		Workers      []struct {
			Worker        struct{ Pod string }
			MatchedBlocks *int `json:"matchedBlocks"`
		}
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, buf.String())
	}
	if got.BlockSize != 16 || got.PromptBlocks != 2 || len(got.Workers) != 1 || got.Workers[0].Worker.Pod != "pod-a" ||
		got.Workers[0].MatchedBlocks == nil {
		t.Errorf("JSON %s decoded to %+v (zero fields must be present)", buf.String(), got)
	}
}

func TestCallError(t *testing.T) {
	err := &ctl.CallError{Call: "score", Addr: "h:1", Status: status.New(codes.InvalidArgument, "model: required")}
	if got, want := err.Error(), "score at h:1: InvalidArgument: model: required"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("status.Code = %v", status.Code(err))
	}
}

func TestRenderExplain(t *testing.T) {
	req := &kvindexv1.ScoreRequest{Model: "llama", TokenIds: make([]uint32, 64)}
	resp := &kvindexv1.ScoreResponse{BlockSize: 16, PromptBlocks: 4, Policy: "cache_aware", Workers: []*kvindexv1.WorkerScore{
		{
			Worker: &kvindexv1.WorkerRef{Pod: "pod-b"}, MatchedBlocks: 4, SpeculativeBlocks: 1, Overlap: 1, Score: -10,
			Health: kvindexv1.WorkerHealth_WORKER_HEALTH_OK,
			Load:   &kvindexv1.LoadDetail{Running: 2, Waiting: 1, Source: "scrape", InflightRequests: 3, QueuedPrefillTokens: 30},
			Reason: "4/4 blocks cached (GPU 4; 1 expected from recent routes); cost = 0 own prefill + 0.3 x 30 queued = 10 tokens",
		},
		{Worker: &kvindexv1.WorkerRef{Pod: "pod-a"}, Score: -64, Load: &kvindexv1.LoadDetail{Source: "none"}, Health: kvindexv1.WorkerHealth_WORKER_HEALTH_STALE},
	}}
	var buf bytes.Buffer
	if err := ctl.RenderExplain(&buf, req, resp); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"model: llama",
		"policy: cache_aware",
		"prompt blocks: 4 blocks of 16 tokens",
		"",
		"RANK WORKER HEALTH MATCHED OVERLAP RUNNING/WAITING IN FLIGHT QUEUED TOKENS PENALTY SCORE",
		"1 pod-b/0 OK 4 (1 spec.) 1.00 2/1 (scrape) 3 30 0 -10",
		"2 pod-a/0 STALE 0 0.00 - 0 0 0 -64",
		"",
		"pod-b/0: 4/4 blocks cached (GPU 4; 1 expected from recent routes); cost = 0 own prefill + 0.3 x 30 queued = 10 tokens",
	}
	if got := lines(buf.String()); !reflect.DeepEqual(got, want) {
		t.Errorf("RenderExplain:\n%s\nwant:\n%s", buf.String(), strings.Join(want, "\n"))
	}
}

// TestScoreArgsText: a prompt and a chat from stdin become the request's
// prompt and messages.
func TestScoreArgsText(t *testing.T) {
	req, err := ctl.ScoreArgs{PromptArgs: ctl.PromptArgs{Model: "m", Prompt: "once upon"}}.Request(nil)
	if err != nil || req.GetPrompt() != "once upon" || len(req.GetTokenIds()) != 0 {
		t.Fatalf("prompt: %v, %v", req, err)
	}
	req, err = ctl.ScoreArgs{PromptArgs: ctl.PromptArgs{Model: "m", MessagesFile: "-"}}.Request(strings.NewReader(`[{"role":"system","content":"be terse"},{"role":"user","content":"hi"}]`))
	if err != nil || len(req.GetMessages()) != 2 || req.GetMessages()[1].GetContent() != "hi" {
		t.Fatalf("messages: %v, %v", req, err)
	}
	if _, err := (ctl.ScoreArgs{PromptArgs: ctl.PromptArgs{Model: "m", MessagesFile: "-"}}).Request(strings.NewReader(`{"role":"user"}`)); err == nil || !strings.Contains(err.Error(), "JSON array") {
		t.Fatalf("not an array: %v", err)
	}
}

func TestParseHashes(t *testing.T) {
	got, err := ctl.ParseHashes("[1, 0x10,\n-1 18446744073709551615]")
	if want := []uint64{1, 16, 1<<64 - 1, 1<<64 - 1}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseHashes = %v %v, want %v", got, err, want)
	}
	if _, err := ctl.ParseHashes("1,zz"); err == nil || !strings.Contains(err.Error(), `hash 1 "zz"`) {
		t.Fatalf("bad hash: %v", err)
	}
}

func TestWatchArgsRequest(t *testing.T) {
	req, err := ctl.WatchArgs{Model: "m", Workers: []string{"p/1"}, Kinds: []string{"stored", "RESET"}, Buffer: 9}.WatchRequest()
	if err != nil || req.GetModel() != "m" || len(req.GetWorkers()) != 1 || req.GetWorkers()[0].GetDpRank() != 1 || req.GetBuffer() != 9 ||
		!reflect.DeepEqual(req.GetKinds(), []kvindexv1.WatchEventKind{kvindexv1.WatchEventKind_WATCH_EVENT_KIND_STORED, kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESET}) {
		t.Fatalf("WatchRequest = %v, %v", req, err)
	}
	if _, err := (ctl.WatchArgs{Kinds: []string{"unspecified"}}).WatchRequest(); err == nil || !strings.Contains(err.Error(), "--kind") {
		t.Fatalf("bad kind: %v", err)
	}
}

func TestCallErrorHints(t *testing.T) {
	for c, want := range map[codes.Code]string{
		codes.Unavailable:       "cannot be reached",
		codes.Unauthenticated:   "--token-file",
		codes.PermissionDenied:  "scope",
		codes.ResourceExhausted: "retry later",
	} {
		err := &ctl.CallError{Call: "lookup", Addr: "h:1", Status: status.New(c, "x")}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v: %q lacks %q", c, err.Error(), want)
		}
	}
}

// TestRenderRestored: a restore prints where it came from and what the
// worker holds after it.
func TestRenderRestored(t *testing.T) {
	var b strings.Builder
	ev := &kvindexv1.WatchResponse{Worker: &kvindexv1.WorkerRef{Pod: "p", DpRank: 1}, Model: "m", Kind: kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESTORED, Blocks: 29500, Reason: "snapshot"}
	if err := ctl.RenderWatchEvent(&b, ev); err != nil {
		t.Fatal(err)
	}
	if want := "- p/1 m restored from snapshot, 29500 blocks\n"; b.String() != want {
		t.Fatalf("rendered %q, want %q", b.String(), want)
	}
	req, err := ctl.WatchArgs{Kinds: []string{"restored"}}.WatchRequest()
	if err != nil || len(req.GetKinds()) != 1 || req.GetKinds()[0] != kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESTORED {
		t.Fatalf("--kind restored: %v %v", req, err)
	}
}
