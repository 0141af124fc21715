package config

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/events"
)

func TestParseDefaultsAndWorkers(t *testing.T) {
	c, err := Parse([]byte(`
grpc_listen: "127.0.0.1:0"
models:
  - name: llama
    block_size: 32
pods:
  - name: a
    model: llama
    endpoint: tcp://10.0.0.5:5557
    dp_size: 2
  - name: b
    model: qwen
    endpoint: ipc:///tmp/kv
    dp_size: 2
    topic: kv@b@qwen
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.MetricsListen != ":9400" || c.Limits.MaxTokens != 1<<20 || c.Log.Level != "info" {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if m := c.model("qwen"); m == nil || m.BlockSize != DefaultBlockSize {
		t.Fatalf("pod-only model: %+v", m)
	}
	if m := c.model("llama"); m.BlockSize != 32 {
		t.Fatalf("llama block size %d", m.BlockSize)
	}
	got := c.Workers()
	want := []WorkerEndpoint{
		{events.WorkerRef{Pod: "a", DPRank: 0}, "llama", "tcp://10.0.0.5:5557", "", "", 0},
		{events.WorkerRef{Pod: "a", DPRank: 1}, "llama", "tcp://10.0.0.5:5558", "", "", 0},
		{events.WorkerRef{Pod: "b", DPRank: 0}, "qwen", "ipc:///tmp/kv", "kv@b@qwen", "", 0},
		{events.WorkerRef{Pod: "b", DPRank: 1}, "qwen", "ipc:///tmp/kv_dp1", "kv@b@qwen", "", 0},
	}
	if len(got) != len(want) {
		t.Fatalf("workers = %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("worker %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestDefaultYAMLIsValid(t *testing.T) {
	c, err := Parse(DefaultYAML)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Workers()) != 1 || c.Workers()[0].Endpoint != "tcp://127.0.0.1:5557" {
		t.Fatalf("workers = %+v", c.Workers())
	}
}

func TestInvalidNamesTheField(t *testing.T) {
	for _, tc := range []struct{ yaml, field string }{
		{"pods: [{name: a, model: m}]", "pods[0].endpoint"},
		{"pods: [{model: m, endpoint: 'tcp://h:1'}]", "pods[0].name"},
		{"pods: [{name: a, endpoint: 'tcp://h:1'}]", "pods[0].model"},
		{"pods: [{name: a, model: m, endpoint: 'tcp://h:1', dp_size: -1}]", "pods[0].dp_size"},
		{"pods: [{name: a, model: m, endpoint: 'tcp://h'}]", "pods[0].endpoint"},
		{"pods: [{name: a, model: m, endpoint: 'tcp://h:65535', dp_size: 2}]", "pods[0].endpoint"},
		{"pods: [{name: a, model: m, endpoint: 'tcp://h:1', dp_size: 2}, {name: b, model: m, endpoint: 'tcp://h:2'}]", "pods[1].endpoint"},
		{"pods: [{name: a, model: m, endpoint: 'tcp://h:1'}, {name: a, model: m, endpoint: 'tcp://h:2'}]", "pods[1].name"},
		{"models: [{name: m, block_size: -16}]", "models[0].block_size"},
		{"grpc_listen: nonsense", "grpc_listen"},
		{"log: {level: loud}", "log.level"},
		{"typo_field: 1", "typo_field"},
	} {
		_, err := Parse([]byte(tc.yaml))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: err = %v, want ErrInvalid naming %s", tc.yaml, err, tc.field)
		}
	}
}

// TestREADMEExampleParses keeps the README's configuration example valid.
func TestREADMEExampleParses(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```yaml\n")
	if !ok {
		t.Fatal("README has no yaml block")
	}
	block, _, _ := strings.Cut(rest, "```")
	c, err := Parse([]byte(block))
	if err != nil {
		t.Fatalf("README example: %v", err)
	}
	if len(c.Workers()) != 3 || c.Workers()[0].ReplayEndpoint != "tcp://10.0.0.5:5567" || len(c.Push) != 1 {
		t.Fatalf("README example parsed to %+v", c)
	}
	if p, _ := c.Policy(); p.Guard.String() != "cost" {
		t.Fatalf("policy %+v", p)
	}
}
