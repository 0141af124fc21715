package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/netutil"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestRunPrintsTheTable(t *testing.T) {
	out, err := run(t, "run", "--workload", "prefixes", "--requests", "60", "--engines", "2", "--routers", "round-robin,precise+load",
		"--cache-blocks", "2000", "--prefill-rate", "20000")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"virtual time", "prefixes: 60 requests", "round-robin", "precise+load", "2 engines x 2000 blocks"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"run", "--routers", "nope"},
		{"analyze", "--sweep-cache", "x", "log.jsonl"},
		{"run", "--workload", "/no/such/trace.jsonl"},
		{"run", "--precise-load-mode", "magic", "--workload", "prefixes", "--requests", "5"},
		{"grid", "--rates", "fast"},
		{"grid", "--rates", "-1"},
		{"grid", "--caches", "big"},
		{"grid", "--workloads", "prefixes"},
		{"grid", "--cells", "no-such-cell"},
	} {
		if _, err := run(t, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestPrintConfig(t *testing.T) {
	out, err := run(t, "live", "--workload", "prefixes", "--requests", "5", "--print-config", "--base-port", "7000", "--engines", "2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "tcp://127.0.0.1:7000") || !strings.Contains(out, "precise+load-vllm-1") {
		t.Errorf("config:\n%s", out)
	}
}

func TestZipfZeroIsUniform(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		zipf    float64
		uniform bool
	}{
		{nil, 1.1, false},
		{[]string{"--zipf", "0"}, 0, true},
		{[]string{"--zipf", "0.8"}, 0.8, false},
	} {
		f := &flags{}
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		f.register(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		rc, err := f.config()
		if err != nil {
			t.Fatal(err)
		}
		if p := rc.Workload.Prefixes; p.ZipfS != tc.zipf || p.Uniform != tc.uniform {
			t.Errorf("%v: ZipfS %v, Uniform %v; want %v, %v", tc.args, p.ZipfS, p.Uniform, tc.zipf, tc.uniform)
		}
	}
	if _, err := run(t, "run", "--workload", "prefixes", "--zipf", "-1"); err == nil {
		t.Error("--zipf -1: no error")
	}
}

// TestEngineAndLoadCommands runs `kvsim engine` and, against it, `kvsim
// load` with no kvindex reachable: every request is served round-robin
// and the summary says so.
func TestEngineAndLoadCommands(t *testing.T) {
	base, err := netutil.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	root := newRoot()
	root.SetArgs([]string{"engine", "--model", "m", "--pod", "e0", "--http", fmt.Sprintf("127.0.0.1:%d", base),
		"--publish", fmt.Sprintf("tcp://127.0.0.1:%d", base+1), "--replay", fmt.Sprintf("tcp://127.0.0.1:%d", base+2), "--cache-blocks", "1000"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	url := fmt.Sprintf("http://127.0.0.1:%d", base)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine never answered /health: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mport, err := netutil.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	scraped := make(chan string, 1)
	go func() { // the load's /metrics while it runs
		for time.Now().Before(deadline) {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", mport))
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.Contains(string(b), `kvsim_load_routes_total{by="round_robin"}`) {
					scraped <- string(b)
					return
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		scraped <- ""
	}()
	out, err := run(t, "load", "--kvindex", "127.0.0.1:1", "--engine", "e0="+url, "--model", "m", "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", mport),
		"--rate", "30", "--duration", "1s", "--system-tokens", "128", "--prefixes", "2")
	if err != nil {
		t.Fatal(err)
	}
	var sent, rr int
	if _, err := fmt.Sscanf(out, "sent %d, failed 0, dropped 0; routed by kvindex 0, round-robin %d;", &sent, &rr); err != nil || sent == 0 || rr != sent {
		t.Fatalf("summary %q (%v)", out, err)
	}
	if m := <-scraped; !strings.Contains(m, "kvsim_load_requests_total") {
		t.Fatalf("the load's /metrics: %q", m)
	}
	for _, args := range [][]string{
		{"load", "--engine", "e0=" + url},
		{"load", "--kvindex", "x:1", "--engine", "nourl"},
		{"engine", "--publish", "", "--http", "127.0.0.1:0"},
	} {
		if _, err := run(t, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestGridCommand(t *testing.T) {
	dir := t.TempDir()
	out, err := run(t, "grid", "--workloads", "tools,sessions", "--rates", "1x", "--caches", "3k", "--requests", "20", "--dir", dir,
		"--cells", "tools-*")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kvsim grid cell tools-1x-3k", "tools: ", "| tools-1x-3k | ", "of 1 cells"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "sessions-1x-3k") {
		t.Errorf("--cells tools-* ran sessions:\n%s", out)
	}
}

// TestREADMEListsEveryCommand: the README's architecture table names
// every kvsim subcommand, and no other.
func TestREADMEListsEveryCommand(t *testing.T) {
	b, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, row, ok1 := strings.Cut(string(b), "`testbed/cmd/kvsim` the fleet simulator")
	row, _, ok2 := strings.Cut(row, "`testbed/cmd/kvbench`")
	if !ok1 || !ok2 {
		t.Fatal("README.md's architecture table does not describe testbed/cmd/kvsim before testbed/cmd/kvbench")
	}
	var listed []string
	for i, part := range strings.Split(row, "`") {
		if i%2 == 1 { // inside backquotes
			listed = append(listed, part)
		}
	}
	var cmds []string
	for _, c := range newRoot().Commands() {
		cmds = append(cmds, c.Name())
	}
	slices.Sort(listed)
	slices.Sort(cmds)
	if !slices.Equal(listed, cmds) {
		t.Errorf("README.md lists kvsim commands %v, kvsim has %v", listed, cmds)
	}
}

func TestModelLayoutFlag(t *testing.T) {
	out, err := run(t, "run", "--workload", "prefixes", "--requests", "40", "--engines", "2", "--routers", "precise",
		"--cache-blocks", "4000", "--model-layout", "gpt-oss")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"blocks of 16 tokens; KV-cache groups gpt-oss: 1 sliding_window (window 128) + 1 full_attention",
		"kvindex's predicted hit vs the engine's"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The preset's block size unless --block-size says otherwise, in
	// either order.
	for _, args := range [][]string{{"--model-layout", "deepseek"}, {"--block-size", "32", "--model-layout", "deepseek"}} {
		out, err := run(t, append([]string{"run", "--workload", "prefixes", "--requests", "5", "--routers", "round-robin"}, args...)...)
		want := "blocks of 64 tokens; KV-cache groups deepseek: 1 mla_attention"
		if len(args) > 2 {
			want = "blocks of 32 tokens; KV-cache groups deepseek"
		}
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("%v: %v, output lacks %q:\n%s", args, err, want, out)
		}
	}
	if _, err := run(t, "run", "--model-layout", "mistral"); err == nil || !strings.Contains(err.Error(), "qwen3-next") {
		t.Errorf("unknown layout: %v", err)
	}
}
