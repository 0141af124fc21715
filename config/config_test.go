package config

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/scoring"
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

func TestDefault(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(c.Workers()) != 1 || c.Workers()[0].Endpoint != "tcp://127.0.0.1:5557" {
		t.Fatalf("workers = %+v", c.Workers())
	}
	// The same configuration as a file: what README.md says serve runs
	// without --config.
	parsed, err := Parse([]byte(`
grpc_listen: ":50051"
metrics_listen: ":9400"
models:
  - name: default
    block_size: 16
pods:
  - name: vllm-0
    model: default
    endpoint: tcp://127.0.0.1:5557
`))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(parsed, c) {
		t.Fatalf("Default() = %+v, the same as YAML = %+v", c, parsed)
	}
	c.Pods[0].Name = "changed"
	c.Models = append(c.Models, Model{Name: "x"})
	if again := Default(); again.Pods[0].Name != DefaultPod || len(again.Models) != 1 {
		t.Fatalf("Default() shares state between calls: %+v", again)
	}
}

func TestSetDefaults(t *testing.T) {
	c := Config{
		Pods: []Pod{{Name: "a", Model: "m", Endpoint: "tcp://h:1"}},
		Push: []Push{{Listen: "tcp://*:2", Routes: []Route{{Topic: "t", Pod: "b", Model: "r"}}}},
	}
	c.SetDefaults()
	want := Config{
		GRPCListen:    DefaultGRPCListen,
		MetricsListen: DefaultMetricsListen,
		Models:        []Model{{Name: "m", BlockSize: DefaultBlockSize}, {Name: "r", BlockSize: DefaultBlockSize}},
		Pods:          []Pod{{Name: "a", Model: "m", Endpoint: "tcp://h:1", DPSize: DefaultDPSize}},
		Push:          c.Push,
		Events: Events{
			GapPolicy: DefaultGapPolicy, ReplayTimeout: DefaultReplayTimeout, ReplayConcurrency: DefaultReplayConcurrency,
			StaleAfterDisconnect: DefaultStaleAfterDisconnect, QueueSize: DefaultQueueSize, QueueBytes: DefaultQueueBytes, MaxMessageBytes: DefaultMaxMessageBytes,
		},
		Scoring: Scoring{
			Policy: DefaultScoringPolicy, GPUWeight: DefaultGPUWeight, CPUWeight: DefaultCPUWeight, StorageWeight: DefaultStorageWeight,
			UnknownTier: DefaultUnknownTier, LoadWeight: DefaultLoadWeight, Guard: DefaultGuard, StaticK: DefaultStaticK,
			SpeculativeTTL: DefaultSpeculativeTTL, InflightTTL: DefaultInflightTTL, ScrapeInterval: DefaultScrapeInterval,
			GroupCaps: new(DefaultGroupCaps),
		},
		Limits: Limits{MaxTokens: api.DefaultMaxTokens, MaxBlockKeys: api.DefaultMaxBlockKeys, MaxCandidates: api.DefaultMaxCandidates, MaxInflight: scoring.DefaultMaxFlights, MaxPending: api.DefaultMaxPending, QueueTarget: api.DefaultQueueTarget, MaxQueueDelay: api.DefaultMaxQueueDelay, MaxConnections: DefaultMaxConnections,
			MaxInspect: api.DefaultMaxInspect(), MaxInspectPending: api.DefaultMaxInspectPending, InspectWait: api.DefaultInspectWait},
		Log: Log{Level: DefaultLogLevel, Format: DefaultLogFormat, ProblemInterval: DefaultProblemInterval},
		Tokenize: Tokenize{Timeout: DefaultTokenizeTimeout, CacheEntries: DefaultTokenizeCacheEntries,
			MaxConcurrent: DefaultTokenizeMaxConcurrent, MaxPromptBytes: DefaultTokenizeMaxPromptBytes},
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("SetDefaults:\n got %+v\nwant %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	again := c
	again.Models = slices.Clone(c.Models)
	again.SetDefaults()
	if !reflect.DeepEqual(again, c) {
		t.Fatalf("SetDefaults twice: %+v", again)
	}

	set := Config{
		GRPCListen: "127.0.0.1:1", MetricsListen: MetricsOff,
		Events:  Events{GapPolicy: "keep", StaleAfterDisconnect: -1},
		Scoring: Scoring{Policy: "longest_prefix", LoadWeight: 2, ScrapeInterval: time.Hour, GroupCaps: new(false)},
		Limits:  Limits{MaxTokens: 7},
		Log:     Log{Level: "debug"},
	}
	set.SetDefaults()
	if set.GRPCListen != "127.0.0.1:1" || set.MetricsListen != MetricsOff || set.Events.GapPolicy != "keep" ||
		set.Events.StaleAfterDisconnect != -1 || set.Scoring.Policy != "longest_prefix" || set.Scoring.LoadWeight != 2 ||
		set.Scoring.ScrapeInterval != time.Hour || set.Limits.MaxTokens != 7 || set.Log.Level != "debug" || set.Scoring.GroupCapsOn() {
		t.Fatalf("SetDefaults replaced set fields: %+v", set)
	}
}

// TestDefaultPolicyIsScorings: the scoring defaults SetDefaults fills in
// make the same policy as scoring's own default.
func TestDefaultPolicyIsScorings(t *testing.T) {
	p, err := Default().Policy()
	if err != nil {
		t.Fatal(err)
	}
	if want := scoring.DefaultPolicy(); !reflect.DeepEqual(p, want) {
		t.Fatalf("Default().Policy() = %+v, scoring.DefaultPolicy() = %+v", p, want)
	}
	if g, err := events.ParseGapPolicy(DefaultGapPolicy); err != nil || g != events.GapReset {
		t.Fatalf("DefaultGapPolicy %q = %v, %v", DefaultGapPolicy, g, err)
	}
}

// TestREADMEExampleParses keeps the README's configuration example valid.
func TestREADMEExampleParses(t *testing.T) {
	c, err := Parse(readmeYAML(t))
	if err != nil {
		t.Fatalf("README example: %v", err)
	}
	if len(c.Workers()) != 3 || c.Workers()[0].ReplayEndpoint != "tcp://10.0.0.5:5567" || len(c.Push) != 1 || c.Push[0].DPSize != 2 {
		t.Fatalf("README example parsed to %+v", c)
	}
	if p, _ := c.Policy(); p.Guard.String() != "ttft" || p.Cost != scoring.DefaultCostModel() || p.Weights != scoring.DefaultPolicy().Weights {
		t.Fatalf("policy %+v", p)
	}
	if tiers, err := c.Tiers(); err != nil || tiers.Unknown() != events.MediumOther {
		t.Fatalf("tiers %v, %v", tiers, err)
	}
}

// TestREADMEFleetExamplesParse keeps the README's fleet configurations
// valid: the agent's names its pod and NATS, the replica's NATS and its
// shard (nats.models, not the top-level models), the nats.tls example
// every field.
func TestREADMEFleetExamplesParse(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for rest := string(b); ; {
		var ok bool
		if _, rest, ok = strings.Cut(rest, "```yaml\n"); !ok {
			break
		}
		var block string
		block, rest, _ = strings.Cut(rest, "```")
		blocks = append(blocks, block)
	}
	var agent, replica, direct, natsTLS *Config
	for _, blk := range blocks {
		switch {
		case strings.HasPrefix(blk, "nats:"):
			if natsTLS, err = Parse([]byte(blk)); err != nil {
				t.Fatalf("README nats.tls example: %v", err)
			}
		case strings.HasPrefix(blk, "discovery:"):
			if direct, err = Parse([]byte(blk)); err != nil {
				t.Fatalf("README discovery example: %v", err)
			}
		case strings.HasPrefix(blk, "# agent.yaml"):
			if agent, err = Parse([]byte(blk)); err != nil {
				t.Fatalf("README agent.yaml: %v", err)
			}
		case strings.HasPrefix(blk, "# replica.yaml"):
			if replica, err = Parse([]byte(blk)); err != nil {
				t.Fatalf("README replica.yaml: %v", err)
			}
		}
	}
	if agent == nil || replica == nil {
		t.Fatalf("README lacks the agent.yaml or replica.yaml example (%d yaml blocks)", len(blocks))
	}
	pod, err := agent.ValidateAgent()
	if err != nil || pod.Name != "vllm-0" || agent.NATS.URL != "nats://nats:4222" || agent.Agent.Checkpoint == "" {
		t.Fatalf("agent.yaml: pod %+v, err %v, config %+v", pod, err, agent)
	}
	if !replica.NATS.Enabled() || len(replica.Pods) != 0 || !slices.Equal(replica.NATS.Models, []string{"meta-llama/Llama-3.1-8B-Instruct"}) {
		t.Fatalf("replica.yaml: %+v", replica)
	}
	if natsTLS == nil || natsTLS.NATS.TLS.CAFile == "" || natsTLS.NATS.TLS.CertFile == "" || natsTLS.NATS.TLS.KeyFile == "" || natsTLS.NATS.TLS.ServerName == "" {
		t.Fatalf("README nats.tls example: %+v", natsTLS)
	}
	if direct == nil || direct.Discovery.Kubernetes == nil || direct.Discovery.Kubernetes.Selector != "app=vllm" || direct.Discovery.Kubernetes.ReplayPort != 5567 {
		t.Fatalf("README discovery example: %+v", direct)
	}
}

// readmeYAML returns README.md's configuration example.
func readmeYAML(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```yaml\n")
	if !ok {
		t.Fatal("README has no yaml block")
	}
	block, _, _ := strings.Cut(rest, "```")
	return []byte(block)
}

// The ingest defaults are the ZeroMQ transport's own (config does not
// import the transport, which needs cgo).
func TestEventDefaultsAreTheTransports(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"replay_timeout", DefaultReplayTimeout, zmq.DefaultReplayTimeout},
		{"replay_concurrency", DefaultReplayConcurrency, zmq.DefaultReplayConcurrency},
		{"stale_after_disconnect", DefaultStaleAfterDisconnect, zmq.DefaultStaleAfterDisconnect},
		{"queue_size", DefaultQueueSize, zmq.DefaultQueueSize},
		{"queue_bytes", int64(DefaultQueueBytes), int64(zmq.DefaultQueueBytes)},
		{"max_message_bytes", int64(DefaultMaxMessageBytes), int64(zmq.DefaultMaxMessageBytes)},
	} {
		if c.got != c.want {
			t.Errorf("events.%s default %v, transport's %v", c.name, c.got, c.want)
		}
	}
}

func TestPushDefaultIsTheTransports(t *testing.T) {
	if DefaultPushMaxWorkers != zmq.DefaultPushMaxWorkers {
		t.Fatalf("push max_workers default %d, transport's %d", DefaultPushMaxWorkers, zmq.DefaultPushMaxWorkers)
	}
	if maxDPSize != zmq.MaxDPRank {
		t.Fatalf("dp_size bound %d, transport's rank bound %d", maxDPSize, zmq.MaxDPRank)
	}
}

func TestValidateAgent(t *testing.T) {
	c := Default()
	if _, err := c.ValidateAgent(); err == nil || !strings.Contains(err.Error(), "nats.url") {
		t.Fatalf("agent without nats: %v", err)
	}
	c.NATS.URL = "nats://127.0.0.1:4222"
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := c.ValidateAgent()
	if err != nil || p.Name != DefaultPod || c.NATS.Bucket != DefaultNATSBucket || c.NATS.RegistrationTTL != DefaultRegistrationTTL {
		t.Fatalf("agent: %v, %v, %+v", p, err, c.NATS)
	}
	c.Pods = append(c.Pods, Pod{Name: "other", Model: DefaultModel, Endpoint: "tcp://127.0.0.1:6000"})
	if _, err := c.ValidateAgent(); err == nil || !strings.Contains(err.Error(), "agent.pod") {
		t.Fatalf("two pods, none named: %v", err)
	}
	c.Agent.Pod = "other"
	if p, err := c.ValidateAgent(); err != nil || p.Name != "other" {
		t.Fatalf("named pod: %v, %v", p, err)
	}
	c.Agent.Pod = "nope"
	if _, err := c.ValidateAgent(); err == nil {
		t.Fatal("unknown pod accepted")
	}
}

func TestCostModelSection(t *testing.T) {
	c, err := Parse([]byte("scoring:\n  guard: ttft\n  cost_model:\n    prefill_tokens_per_sec: 20000\n    attention_pairs_per_sec: 1.2e9\n    step_overhead: 8ms\n    max_num_seqs: 256\n    kv_capacity_tokens: 100000\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Policy()
	if err != nil {
		t.Fatal(err)
	}
	want := scoring.DefaultCostModel()
	want.PrefillTokensPerSec, want.AttentionPairsPerSec, want.StepOverhead, want.KVCapacityTokens = 20000, 1.2e9, 8*time.Millisecond, 100000
	want.MaxNumSeqs = 256
	if p.Guard != scoring.GuardTTFT || p.Cost != want {
		t.Fatalf("policy %+v, want the ttft guard with %+v", p, want)
	}
	if _, err := Parse([]byte("scoring:\n  cost_model:\n    attention_pairs_per_sec: -1\n")); err == nil || !strings.Contains(err.Error(), "cost_model") {
		t.Fatalf("a negative attention rate: %v", err)
	}
	if _, err := Parse([]byte("scoring:\n  cost_model:\n    max_num_seqs: -1\n")); err == nil || !strings.Contains(err.Error(), "max_num_seqs") {
		t.Fatalf("a negative max_num_seqs: %v", err)
	}
}

// TestGroupCaps: scoring.group_caps is on unless set false, and the
// daemon's kill switch reads it so.
func TestGroupCaps(t *testing.T) {
	for _, c := range []struct {
		yaml string
		want bool
	}{{"", true}, {"scoring:\n  group_caps: true\n", true}, {"scoring:\n  group_caps: false\n", false}} {
		cfg, err := Parse([]byte("models: [{name: m}]\npods: [{name: a, model: m, endpoint: 'tcp://h:1'}]\n" + c.yaml))
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Scoring.GroupCapsOn(); got != c.want || cfg.Scoring.GroupCaps == nil {
			t.Errorf("%q: group caps %v (set %v), want %v", c.yaml, got, cfg.Scoring.GroupCaps != nil, c.want)
		}
	}
	if !(&Scoring{}).GroupCapsOn() {
		t.Error("an unset group_caps is off")
	}
}
