package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

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

// TestSectionErrors checks every error Validate reports, each through the
// check of its section, on an otherwise valid configuration.
func TestSectionErrors(t *testing.T) {
	pod := func(name, endpoint string) Pod { return Pod{Name: name, Model: "m", Endpoint: endpoint, DPSize: 1} }
	for _, tc := range []struct {
		name        string
		edit        func(*Config)
		field, text string
	}{
		{"grpc", func(c *Config) { c.GRPCListen = "" }, "grpc_listen", `"" is not host:port`},
		{"metrics", func(c *Config) { c.MetricsListen = "9400" }, "metrics_listen", `"9400" is not host:port or off`},
		{"http", func(c *Config) { c.HTTPListen = "8080" }, "http_listen", `"8080" is not host:port`},
		{"limits", func(c *Config) { c.Limits.MaxCandidates = -1 }, "limits", "limits must not be negative"},
		{"limits", func(c *Config) { c.Limits.MaxInspect = -1 }, "limits", "limits must not be negative"},
		{"limits", func(c *Config) { c.Limits.InspectWait = -time.Second }, "limits", "limits must not be negative"},
		{"log level", func(c *Config) { c.Log.Level = "" }, "log.level", `"" is not debug, info, warn or error`},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format", `"xml" is not text or json`},
		{"gap policy", func(c *Config) { c.Events.GapPolicy = "drop" }, "events.gap_policy", `"drop" is not reset or keep`},
		{"replay timeout", func(c *Config) { c.Events.ReplayTimeout = -time.Second }, "events", "durations and sizes must not be negative"},
		{"replay concurrency", func(c *Config) { c.Events.ReplayConcurrency = -1 }, "events", "must not be negative"},
		{"queue size", func(c *Config) { c.Events.QueueSize = -1 }, "events", "must not be negative"},
		{"silence", func(c *Config) { c.Events.StaleAfterSilence = -1 }, "events", "must not be negative"},
		{"policy", func(c *Config) { c.Scoring.Policy = "random" }, "scoring", `unknown policy "random"`},
		{"guard", func(c *Config) { c.Scoring.Guard = "wall" }, "scoring", `unknown guard "wall"`},
		{"weight", func(c *Config) { c.Scoring.CPUWeight = -1 }, "scoring", "cpu_weight: -1 must be a positive finite number"},
		{"ttl", func(c *Config) { c.Scoring.InflightTTL = -1 }, "scoring", "durations must not be negative"},
		{"scrape", func(c *Config) { c.Scoring.ScrapeInterval = -1 }, "scoring", "durations must not be negative"},
		{"memory", func(c *Config) { c.Index.MemoryBudgetMiB = -1 }, "index.memory_budget_mib", "-1 must not be negative"},
		{"model name", func(c *Config) { c.Models = append(c.Models, Model{BlockSize: 16}) }, "models[1].name", "required"},
		{"model twice", func(c *Config) { c.Models = append(c.Models, c.Models[0]) }, "models[1].name", `model "default" listed twice`},
		{"block size", func(c *Config) { c.Models[0].BlockSize = 0 }, "models[0].block_size", "0 must be positive"},
		{"pod name", func(c *Config) { c.Pods[0].Name = "" }, "pods[0].name", "required"},
		{"pod twice", func(c *Config) { c.Pods = append(c.Pods, pod(DefaultPod, "tcp://h:2")) }, "pods[1].name", `pod "vllm-0" listed twice`},
		{"pod model", func(c *Config) { c.Pods[0].Model = "" }, "pods[0].model", "required"},
		{"dp size zero", func(c *Config) { c.Pods[0].DPSize = 0 }, "pods[0].dp_size", "0 must be between 1 and 1024"},
		{"dp size large", func(c *Config) { c.Pods[0].DPSize = 1025 }, "pods[0].dp_size", "1025 must be between 1 and 1024"},
		{"endpoint", func(c *Config) { c.Pods[0].Endpoint = "" }, "pods[0].endpoint", "required"},
		{"endpoint scheme", func(c *Config) { c.Pods[0].Endpoint = "udp://h:1" }, "pods[0].endpoint", "want tcp://host:port, ipc://path or inproc://name"},
		{"endpoint host", func(c *Config) { c.Pods[0].Endpoint = "tcp://h" }, "pods[0].endpoint", `"tcp://h" is not tcp://host:port`},
		{"endpoint port", func(c *Config) { c.Pods[0].Endpoint = "tcp://h:0" }, "pods[0].endpoint", `bad port "0"`},
		{"last rank port", func(c *Config) { c.Pods[0].Endpoint, c.Pods[0].DPSize = "tcp://h:65535", 2 }, "pods[0].endpoint", "65535"},
		{"capacity", func(c *Config) { c.Pods[0].CapacityBlocks = -1 }, "pods[0].capacity_blocks", "-1 must not be negative"},
		{"metrics url", func(c *Config) { c.Pods[0].MetricsURL = "h:8000/metrics" }, "pods[0].metrics_url", `"h:8000/metrics" is not an http(s) URL`},
		{"replay", func(c *Config) { c.Pods[0].ReplayEndpoint = "tcp://h" }, "pods[0].replay_endpoint", "is not tcp://host:port"},
		{"replay last rank", func(c *Config) { c.Pods[0].ReplayEndpoint, c.Pods[0].DPSize = "tcp://h:65535", 2 }, "pods[0].replay_endpoint", "65535"},
		{"replay overlap", func(c *Config) {
			c.Pods[0].Endpoint, c.Pods[0].ReplayEndpoint, c.Pods[0].DPSize = "tcp://h:5557", "tcp://h:5558", 2
		}, "pods[0].endpoint", "tcp://h:5558 (rank 1) is also used by pod vllm-0 replay"},
		{"replay shared", func(c *Config) {
			c.Pods[0].ReplayEndpoint = "tcp://h:9"
			c.Pods = append(c.Pods, pod("b", "tcp://h:2"))
			c.Pods[1].ReplayEndpoint = "tcp://h:9"
		}, "pods[1].replay_endpoint", "tcp://h:9 (rank 0) is also used by pod vllm-0 replay: leave a gap of dp_size"},
		{"endpoint shared", func(c *Config) { c.Pods = append(c.Pods, pod("b", DefaultEndpoint)) }, "pods[1].endpoint", "(rank 0) is also used by pod vllm-0"},
		{"push listen", func(c *Config) { c.Push = []Push{{Listen: "tcp://*"}} }, "push[0].listen", "is not tcp://host:port"},
		{"tls half", func(c *Config) { c.TLS = TLS{CertFile: "c"} }, "tls.cert_file", "give both cert_file and key_file"},
		{"tls ca alone", func(c *Config) { c.TLS = TLS{ClientCAFile: "ca"} }, "tls.client_ca_file", "needs cert_file and key_file"},
		{"tls metrics alone", func(c *Config) { c.TLS = TLS{Metrics: true} }, "tls.metrics", "needs cert_file and key_file"},
		{"token name", func(c *Config) { c.Auth.Tokens = []Token{{Scopes: []string{"read"}, File: "f"}} }, "auth.tokens[0].name", "required"},
		{"token scope", func(c *Config) { c.Auth.Tokens = []Token{{Name: "a", Scopes: []string{"write"}, File: "f"}} }, "auth.tokens[0].scopes[0]", `"write" is not read or route`},
		{"token source", func(c *Config) { c.Auth.Tokens = []Token{{Name: "a", Scopes: []string{"read"}, File: "f", Env: "E"}} }, "auth.tokens[0].file", "give exactly one of file and env"},
		{"cert identity", func(c *Config) { c.Auth.CertIdentity = true }, "auth.cert_identity", "needs tls.client_ca_file"},
		{"nats url", func(c *Config) { c.NATS = NATS{URL: "http://x:4222", RegistrationTTL: time.Second} }, "nats.url", "want nats://host:port"},
		{"nats port", func(c *Config) { c.NATS = NATS{URL: "nats://x", RegistrationTTL: time.Second} }, "nats.url", "is not host:port"},
		{"nats ttl", func(c *Config) { c.NATS = NATS{URL: "nats://x:4222", RegistrationTTL: time.Millisecond} }, "nats.registration_ttl", "at least 1s"},
		{"nats without url", func(c *Config) { c.NATS = NATS{Models: []string{"m"}} }, "nats.url", "required with the other nats settings"},
		{"nats tls without url", func(c *Config) { c.NATS = NATS{TLS: NATSTLS{CAFile: "ca.pem"}} }, "nats.url", "required with the other nats settings"},
		{"nats tls cert alone", func(c *Config) {
			c.NATS = NATS{URL: "tls://x:4222", RegistrationTTL: time.Second, TLS: NATSTLS{CertFile: "c.pem"}}
		}, "nats.tls.cert_file", "give both cert_file and key_file"},
		{"nats tls key alone", func(c *Config) {
			c.NATS = NATS{URL: "tls://x:4222", RegistrationTTL: time.Second, TLS: NATSTLS{KeyFile: "k.pem"}}
		}, "nats.tls.cert_file", "give both cert_file and key_file"},
		{"push max workers", func(c *Config) { c.Push = []Push{{Listen: "tcp://*:1", MaxWorkers: 5000}} }, "push[0].max_workers", "must be between 1 and 4096"},
		{"push allow", func(c *Config) { c.Push = []Push{{Listen: "tcp://*:1", Allow: []string{"10.0.0.0/8", "nope"}}} }, "push[0].allow[1]", `"nope" is not an IP address or CIDR range`},
		{"route twice", func(c *Config) {
			c.Push = []Push{{Listen: "tcp://*:1", Routes: []Route{{Topic: "t", Pod: "a", Model: "m"}, {Topic: "t", Pod: "b", Model: "m"}}}}
		}, "push[0].routes[1].topic", `topic "t" mapped twice`},
		{"route pod", func(c *Config) { c.Push = []Push{{Listen: "tcp://*:1", Routes: []Route{{Topic: "t", Model: "m"}}}} }, "push[0].routes[0].pod", "required"},
		{"route model", func(c *Config) { c.Push = []Push{{Listen: "tcp://*:1", Routes: []Route{{Topic: "t", Pod: "a"}}}} }, "push[0].routes[0].model", "required"},
		{"route pulled", func(c *Config) {
			c.Push = []Push{{Listen: "tcp://*:1", Routes: []Route{{Topic: "t", Pod: DefaultPod, Model: "m"}}}}
		}, "push[0].routes[0].pod", `pod "vllm-0" is also a pull-mode pod`},
		{"route on two listeners", func(c *Config) {
			c.Push = []Push{{Listen: "tcp://*:1", Routes: []Route{{Topic: "t", Pod: "p", Model: "m"}}}, {Listen: "tcp://*:2", Routes: []Route{{Topic: "u", Pod: "q", Model: "m"}, {Topic: "t", Pod: "p", Model: "m"}}}}
		}, "push[1].routes[1].pod", `pod "p" is routed on push[0] too`},
		{"push dp size", func(c *Config) { c.Push = []Push{{Listen: "tcp://*:1", DPSize: -1}} }, "push[0].dp_size", "-1 must be between 1 and 1024"},
		{"push dp size large", func(c *Config) { c.Push = []Push{{Listen: "tcp://*:1", DPSize: 1025}} }, "push[0].dp_size", "1025 must be between 1 and 1024"},
		{"push last rank port", func(c *Config) { c.Push = []Push{{Listen: "tcp://*:65535", DPSize: 2}} }, "push[0].dp_size", `port "65535" cannot be offset by rank 1`},
		{"push rank on grpc", func(c *Config) { c.Push = []Push{{Listen: "tcp://*:50049", DPSize: 3}} }, "push[0].dp_size",
			"tcp://*:50051 (rank 2) is also bound by grpc_listen: leave dp_size ports free"},
		{"push on metrics", func(c *Config) { c.Push = []Push{{Listen: "tcp://127.0.0.1:9400"}} }, "push[0].listen", "tcp://127.0.0.1:9400 (rank 0) is also bound by metrics_listen"},
		{"push on http", func(c *Config) { c.HTTPListen = "10.0.0.1:8080"; c.Push = []Push{{Listen: "tcp://*:8079", DPSize: 2}} }, "push[0].dp_size", "is also bound by http_listen"},
		{"push listeners overlap", func(c *Config) { c.Push = []Push{{Listen: "tcp://*:5557", DPSize: 4}, {Listen: "tcp://10.0.0.1:5559"}} }, "push[1].listen",
			"tcp://10.0.0.1:5559 (rank 0) is also bound by push[0] (rank 2)"},
		{"push host twice", func(c *Config) {
			c.Push = []Push{{Listen: "tcp://10.0.0.1:9000"}, {Listen: "tcp://10.0.0.2:9000"}, {Listen: "tcp://10.0.0.1:8999", DPSize: 2}}
		}, "push[2].dp_size", "tcp://10.0.0.1:9000 (rank 1) is also bound by push[0] (rank 0)"},
		{"push ipc twice", func(c *Config) { c.Push = []Push{{Listen: "ipc:///s", DPSize: 2}, {Listen: "ipc:///s_dp1"}} }, "push[1].listen", "ipc:///s_dp1 (rank 0) is also bound by push[0] (rank 1)"},
		{"route replays overlap", func(c *Config) {
			c.Push = []Push{{Listen: "tcp://*:1", DPSize: 2, Routes: []Route{{Topic: "t", Pod: "a", Model: "m", ReplayEndpoint: "tcp://h:7000"}, {Topic: "u", Pod: "b", Model: "m", ReplayEndpoint: "tcp://h:7001"}}}}
		}, "push[0].routes[1].replay_endpoint", "tcp://h:7001 (rank 0) is also used by pod a replay: leave a gap of dp_size"},
		{"route replay on a pull pod", func(c *Config) {
			c.Push = []Push{{Listen: "tcp://*:1", Routes: []Route{{Topic: "t", Pod: "a", Model: "m", ReplayEndpoint: DefaultEndpoint}}}}
		}, "push[0].routes[0].replay_endpoint", "(rank 0) is also used by pod vllm-0/0"},
		{"route replay last rank", func(c *Config) {
			c.Push = []Push{{Listen: "tcp://*:1", DPSize: 2, Routes: []Route{{Topic: "t", Pod: "a", Model: "m", ReplayEndpoint: "tcp://h:65535"}}}}
		}, "push[0].routes[0].replay_endpoint", "cannot be offset by rank 1"},
		{"route replay", func(c *Config) {
			c.Push = []Push{{Listen: "tcp://*:1", Routes: []Route{{Topic: "t", Pod: "a", Model: "m", ReplayEndpoint: "tcp://h:99999"}}}}
		}, "push[0].routes[0].replay_endpoint", `bad port "99999"`},
	} {
		c := Default()
		tc.edit(c)
		err := c.Validate()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), ": "+tc.field+": ") || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: err = %v, want ErrInvalid naming %s: ...%s", tc.name, err, tc.field, tc.text)
		}
	}
}

// A push listener with dp_size N binds listen's port and the N-1 after it
// (vLLM's offset of a connecting endpoint); listeners and kvindex's other
// listen addresses may sit next to those ranges, or on the same port of
// another host, and routes' replay endpoints a dp_size apart.
func TestPushDPSizeBinds(t *testing.T) {
	c := Default()
	c.HTTPListen = ":8080"
	c.Push = []Push{
		{Listen: "tcp://*:5557", DPSize: 4, Routes: []Route{
			{Topic: "t", Pod: "a", Model: "m", ReplayEndpoint: "tcp://h:7000"},
			{Topic: "u", Pod: "b", Model: "m", ReplayEndpoint: "tcp://h:7004"},
		}},
		{Listen: "tcp://*:5561", DPSize: 2},
		{Listen: "tcp://10.0.0.1:9000"}, {Listen: "tcp://10.0.0.2:9000"},
		{Listen: "tcp://*:8076", DPSize: 4}, // 8076-8079, below http_listen
		{Listen: "ipc:///run/kv", DPSize: 2},
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Push[0].DPSize = 0
	c.SetDefaults()
	if c.Push[0].DPSize != DefaultDPSize || c.Push[1].DPSize != 2 {
		t.Fatalf("dp_size after defaults: %d, %d; want %d, 2", c.Push[0].DPSize, c.Push[1].DPSize, DefaultDPSize)
	}
}

// TestSectionsValidateAlone: each section's check runs without the rest
// of a Config, on a section SetDefaults completed.
func TestSectionsValidateAlone(t *testing.T) {
	var c Config
	c.SetDefaults()
	e, s, l, g, x := c.Events, c.Scoring, c.Limits, c.Log, c.Index
	for name, err := range map[string]error{"events": e.Validate(), "scoring": s.Validate(), "limits": l.Validate(), "log": g.Validate(), "index": x.Validate()} {
		if err != nil {
			t.Errorf("%s with defaults: %v", name, err)
		}
	}
	e.StaleAfterDisconnect = -1 // never stale: allowed
	if err := e.Validate(); err != nil {
		t.Errorf("events with stale_after_disconnect < 0: %v", err)
	}
	if err := (&Events{}).Validate(); err != nil {
		t.Errorf("zero events: %v", err) // "" is the default gap policy
	}
	if err := (&Log{}).Validate(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "log.level") {
		t.Errorf("zero log: %v, want log.level invalid until SetDefaults", err)
	}
	if err := (&Scoring{Guard: "nope"}).Validate(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "scoring: guard:") {
		t.Errorf("bad guard: %v", err)
	}
}

// TestDiscovery: a discovery section gets its defaults (and its model
// listed), and each invalid one is refused naming the field.
func TestDiscovery(t *testing.T) {
	c, err := Parse([]byte("discovery: {kubernetes: {selector: 'app=vllm', model: llama, replay_port: 5567}}"))
	if err != nil {
		t.Fatal(err)
	}
	k := c.Discovery.Kubernetes
	if k.Port != DefaultDiscoveryPort || k.DPSize != 1 || k.Resync != DefaultKubernetesResync || c.model("llama") == nil {
		t.Fatalf("defaults: %+v, models %+v", k, c.Models)
	}
	c, err = Parse([]byte("discovery: {dns: {name: vllm.ns.svc, model: m, server: '10.96.0.10:53'}}"))
	if err != nil || c.Discovery.DNS.Interval != DefaultDNSInterval || !c.Discovery.Enabled() {
		t.Fatalf("dns: %+v %v", c, err)
	}
	for _, tc := range []struct{ yaml, field string }{
		{"discovery: {kubernetes: {selector: 'app=vllm', model: m}, dns: {name: x, model: m}}", "discovery: give one"},
		{"discovery: {kubernetes: {model: m}}", "discovery.kubernetes.selector"},
		{"discovery: {kubernetes: {selector: 'app in (', model: m}}", "discovery.kubernetes.selector"},
		{"discovery: {kubernetes: {selector: 'app=vllm'}}", "discovery.kubernetes.model"},
		{"discovery: {kubernetes: {selector: 'app=vllm', model: m, resync: -1s}}", "discovery.kubernetes.resync"},
		{"discovery: {kubernetes: {selector: 'app=vllm', model: m, port: 70000}}", "discovery.kubernetes.port"},
		{"discovery: {kubernetes: {selector: 'app=vllm', model: m, dp_size: 2, replay_port: 5558}}", "discovery.kubernetes.replay_port"},
		{"discovery: {kubernetes: {selector: 'app=vllm', model: m, metrics_port: -1}}", "discovery.kubernetes.metrics_port"},
		{"discovery: {kubernetes: {selector: 'app=vllm', model: m, capacity_blocks: -1}}", "discovery.kubernetes.capacity_blocks"},
		{"discovery: {dns: {model: m}}", "discovery.dns.name"},
		{"discovery: {dns: {name: x, model: m, interval: 10ms}}", "discovery.dns.interval"},
		{"discovery: {dns: {name: x, model: m, server: nowhere}}", "discovery.dns.server"},
		{"discovery: {dns: {name: x, model: m, dp_size: 2000}}", "discovery.dns.dp_size"},
	} {
		_, err := Parse([]byte(tc.yaml))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: err = %v, want ErrInvalid naming %s", tc.yaml, err, tc.field)
		}
	}
}

// TestRenameAgentPod: --pod-name renames the pod the agent sits beside,
// chosen by agent.pod or as the only one, so one ConfigMap serves a
// Deployment.
func TestRenameAgentPod(t *testing.T) {
	one, err := Parse([]byte("pods: [{name: vllm, model: m, endpoint: 'tcp://127.0.0.1:5557'}]\nnats: {url: 'nats://nats:4222'}"))
	if err != nil {
		t.Fatal(err)
	}
	if err := one.RenameAgentPod("vllm-7f9c-abcde"); err != nil {
		t.Fatal(err)
	}
	if p, err := one.ValidateAgent(); err != nil || p.Name != "vllm-7f9c-abcde" {
		t.Fatalf("renamed: %+v %v", p, err)
	}
	two, err := Parse([]byte("pods: [{name: a, model: m, endpoint: 'tcp://127.0.0.1:5557'}, {name: b, model: m, endpoint: 'tcp://127.0.0.1:6557'}]\nnats: {url: 'nats://nats:4222'}\nagent: {pod: b}"))
	if err != nil {
		t.Fatal(err)
	}
	if err := two.RenameAgentPod("b-0"); err != nil {
		t.Fatal(err)
	}
	if two.Pods[0].Name != "a" || two.Pods[1].Name != "b-0" || two.Agent.Pod != "b-0" {
		t.Fatalf("pods %+v, agent.pod %q", two.Pods, two.Agent.Pod)
	}
	two.Agent.Pod = ""
	if err := two.RenameAgentPod("x"); err == nil {
		t.Fatal("two pods and no agent.pod: no error")
	}
}
