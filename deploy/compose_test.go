package deploy

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v3"

	"github.com/kvindex/kvindex/config"
)

// loadCompose loads docker-compose.yaml as `docker compose` does (.env,
// interpolation, normalisation, the consistency checks), with the given
// profiles active (none: those .env names, as docker compose up takes them).
func loadCompose(t *testing.T, profiles ...string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yaml")},
		cli.WithWorkingDirectory(root), cli.WithEnvFiles(), cli.WithDotEnv, cli.WithInterpolation(true), cli.WithDefaultProfiles(profiles...))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yaml does not load: %v", err)
	}
	return p
}

// ours reports whether s runs the kvindex image built from the Dockerfile.
func ours(s types.ServiceConfig) bool { return s.Build != nil }

// argAfter returns the value following flag in args ("" when absent).
func argAfter(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

func argsAfter(args []string, flag string) []string {
	var out []string
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			out = append(out, args[i+1])
		}
	}
	return out
}

// TestComposeServices: every service has an image or the Dockerfile's
// build, a command, a health check, and the ports it needs; the ones in
// the default profiles are the whole demo.
func TestComposeServices(t *testing.T) {
	all := loadCompose(t, "*")
	want := []string{"agent-0", "agent-1", "agent-2", "engine-0", "engine-1", "engine-2", "grafana", "load", "nats", "prometheus",
		"replica-0", "replica-1", "vllm-0", "vllm-1", "vllm-2", "vllm-agent-0", "vllm-agent-1", "vllm-agent-2"}
	if got := slices.Sorted(func(yield func(string) bool) {
		for n := range all.Services {
			if !yield(n) {
				return
			}
		}
	}); !slices.Equal(got, want) {
		t.Fatalf("services %v, want %v", got, want)
	}
	for name, s := range all.Services {
		switch {
		case ours(s):
			// The simulated engines and the load run the testbed image,
			// everything else the production image (the default target).
			want, target := "kvindex:dev", ""
			if s.Entrypoint != nil && s.Entrypoint[0] == "kvsim" {
				want, target = "kvindex-testbed:dev", "testbed"
			}
			if s.Build.Context != mustAbs(t, root) || s.Build.Dockerfile != "Dockerfile" || s.Image != want || s.Build.Target != target {
				t.Errorf("%s: build %+v image %q, want the repository's Dockerfile (target %q) as %s", name, s.Build, s.Image, target, want)
			}
		case s.Image == "" || !strings.Contains(s.Image, ":") || strings.HasSuffix(s.Image, ":latest"):
			t.Errorf("%s: image %q is not pinned to a tag", name, s.Image)
		}
		if len(s.Command) == 0 && name != "grafana" { // grafana's image runs its own /run.sh, configured by environment
			t.Errorf("%s: no command", name)
		}
		if s.HealthCheck == nil || len(s.HealthCheck.Test) < 2 || s.HealthCheck.Disable {
			t.Errorf("%s: no health check", name)
		} else if ours(s) && (s.HealthCheck.Test[0] != "CMD" || s.HealthCheck.Test[1] != "kvindexctl" || !slices.Contains(s.HealthCheck.Test, "health")) {
			t.Errorf("%s: health check %q, want kvindexctl health", name, s.HealthCheck.Test)
		}
		sidecar := strings.HasPrefix(s.NetworkMode, "service:")
		if sidecar && len(s.Ports) > 0 {
			t.Errorf("%s shares %s's network and cannot publish ports", name, s.NetworkMode)
		}
		if !sidecar && name != "nats" && name != "load" && len(s.Ports) == 0 {
			t.Errorf("%s publishes no port", name)
		}
		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			if _, err := os.Stat(v.Source); err != nil {
				t.Errorf("%s mounts %s, which does not exist: %v", name, v.Source, err)
			}
			if !v.ReadOnly {
				t.Errorf("%s mounts %s writable", name, v.Source)
			}
		}
	}
	def := loadCompose(t) // COMPOSE_PROFILES from .env
	for _, n := range []string{"engine-0", "agent-0", "load", "replica-0", "grafana"} {
		if _, ok := def.Services[n]; !ok {
			t.Errorf("docker compose up (the .env profiles) does not start %s", n)
		}
	}
	if _, ok := def.Services["vllm-0"]; ok {
		t.Error("docker compose up starts the real vLLM without its profile")
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// mountedConfig returns the host file service s mounts at target.
func mountedConfig(t *testing.T, s types.ServiceConfig, target string) string {
	t.Helper()
	for _, v := range s.Volumes {
		if v.Target == target {
			return v.Source
		}
	}
	t.Fatalf("%s mounts nothing at %s", s.Name, target)
	return ""
}

// TestComposeKvindexConfigs: every kvindex configuration the compose file
// mounts parses and validates (agents also as agents), and the services
// agree with each other: each agent shares its engine's network and
// subscribes to the ports it publishes under the pod name it announces;
// NATS is the compose service; the load sends to those pods through the
// replicas.
func TestComposeKvindexConfigs(t *testing.T) {
	p := loadCompose(t, "*")
	pods := map[string]bool{}
	for name, s := range p.Services {
		if !ours(s) || s.Command[0] != "agent" && s.Command[0] != "serve" {
			continue
		}
		path := mountedConfig(t, s, argAfter(s.Command, "--config"))
		cfg, err := config.Load(path)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if u, err := url.Parse(cfg.NATS.URL); err != nil || u.Hostname() != "nats" {
			t.Errorf("%s: nats.url %q is not the compose nats service", name, cfg.NATS.URL)
		}
		if s.Command[0] == "serve" {
			if len(cfg.Pods) != 0 || cfg.GRPCListen != ":50051" || !slices.ContainsFunc(s.Ports, func(pc types.ServicePortConfig) bool { return pc.Target == 50051 }) {
				t.Errorf("%s: a replica should discover its pods and publish gRPC 50051: %+v %+v", name, cfg.Pods, s.Ports)
			}
			continue
		}
		pod, err := cfg.ValidateAgent()
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		engineName, ok := strings.CutPrefix(s.NetworkMode, "service:")
		engine, found := p.Services[engineName]
		if !ok || !found {
			t.Errorf("%s: network_mode %q is not another service's", name, s.NetworkMode)
			continue
		}
		if cfg.MetricsListen != ":9400" || s.HealthCheck.Test[len(s.HealthCheck.Test)-1] != "http://127.0.0.1:9400/healthz" {
			t.Errorf("%s: metrics on %q, health check %q", name, cfg.MetricsListen, s.HealthCheck.Test)
		}
		if cfg.Agent.Checkpoint == "" || !slices.ContainsFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool {
			return v.Type == types.VolumeTypeVolume && strings.HasPrefix(cfg.Agent.Checkpoint, v.Target+"/")
		}) {
			t.Errorf("%s: checkpoint %q is not on a named volume", name, cfg.Agent.Checkpoint)
		}
		if ours(engine) { // a simulated engine: its flags say what it publishes
			if got := argAfter(engine.Command, "--pod"); got != pod.Name {
				t.Errorf("%s announces pod %q, its engine %s is %q", name, pod.Name, engineName, got)
			}
			checkPort(t, name, pod.Endpoint, argAfter(engine.Command, "--publish"))
			checkPort(t, name, pod.ReplayEndpoint, argAfter(engine.Command, "--replay"))
			if got := argAfter(engine.Command, "--cache-blocks"); got != strconv.Itoa(pod.CapacityBlocks) {
				t.Errorf("%s: capacity_blocks %d, engine --cache-blocks %s", name, pod.CapacityBlocks, got)
			}
			pods[pod.Name] = true
		} else { // real vLLM: the README's --kv-events-config recipe
			kv := argAfter(engine.Command, "--kv-events-config")
			for _, want := range []string{`"enable_kv_cache_events":true`, `"publisher":"zmq"`, `"endpoint":"tcp://*:5557"`, `"replay_endpoint":"tcp://*:5567"`, `"topic":"kv@` + pod.Name + "@"} {
				if !strings.Contains(kv, want) {
					t.Errorf("%s: its engine's --kv-events-config %s lacks %s", name, kv, want)
				}
			}
			if !strings.Contains(readFile(t, "README.md"), `--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5567"`) {
				t.Error("the README's recipe changed: keep the vllm profile in step")
			}
		}
	}
	load := p.Services["load"]
	for _, e := range argsAfter(load.Command, "--engine") {
		pod, u, _ := strings.Cut(e, "=")
		host, err := url.Parse(u)
		if !pods[pod] || err != nil || p.Services[host.Hostname()].Name == "" {
			t.Errorf("load --engine %s: no agent announces %s, or %s is no service", e, pod, u)
		}
		delete(pods, pod)
	}
	if len(pods) != 0 {
		t.Errorf("the load sends nothing to %v", pods)
	}
	for _, kv := range argsAfter(load.Command, "--kvindex") {
		host, port, _ := net.SplitHostPort(kv)
		if !strings.HasPrefix(host, "replica-") || port != "50051" || p.Services[host].Name == "" {
			t.Errorf("load --kvindex %s is not a replica's gRPC address", kv)
		}
	}
}

// checkPort fails unless the agent's endpoint (tcp://127.0.0.1:P) is on
// the port the engine binds (tcp://*:P).
func checkPort(t *testing.T, agent, endpoint, bind string) {
	t.Helper()
	_, ep, _ := strings.Cut(endpoint, "127.0.0.1:")
	_, bp, _ := strings.Cut(bind, "*:")
	if ep == "" || ep != bp {
		t.Errorf("%s subscribes to %s, its engine binds %s", agent, endpoint, bind)
	}
}

// TestComposePrometheusAndGrafana: Prometheus scrapes every kvindex and
// engine service on the ports they serve and loads the chart's alert
// rules; Grafana is provisioned with that Prometheus and the chart's
// dashboard.
func TestComposePrometheusAndGrafana(t *testing.T) {
	p := loadCompose(t, "*")
	prom := p.Services["prometheus"]
	var pc struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	b, err := os.ReadFile(mountedConfig(t, prom, "/etc/prometheus/prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &pc); err != nil {
		t.Fatal(err)
	}
	if len(pc.RuleFiles) != 1 || mountedConfig(t, prom, pc.RuleFiles[0]) != mustAbs(t, filepath.Join(root, "deploy/helm/kvindex/files/kvindex-alerts.yaml")) {
		t.Errorf("Prometheus rule files %v are not the chart's alert rules", pc.RuleFiles)
	}
	scraped := map[string]bool{}
	for _, sc := range pc.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				host, port, err := net.SplitHostPort(tg)
				if _, ok := p.Services[host]; err != nil || !ok {
					t.Errorf("job %s scrapes %s, not a compose service", sc.JobName, tg)
				}
				scraped[sc.JobName+"/"+host+":"+port] = true
			}
		}
	}
	for _, want := range []string{"kvindex/replica-0:9400", "kvindex/replica-1:9400", "kvindex-agent/engine-0:9400", "kvindex-agent/engine-2:9400", "vllm/engine-1:8000", "kvsim-load/load:9500"} {
		if !scraped[want] {
			t.Errorf("Prometheus does not scrape %s", want)
		}
	}
	if got := argAfter(p.Services["load"].Command, "--metrics-listen"); got != ":9500" {
		t.Errorf("the load serves metrics on %q", got)
	}
	graf := p.Services["grafana"]
	prov := mountedConfig(t, graf, "/etc/grafana/provisioning")
	var ds struct {
		Datasources []struct{ Type, URL, UID string } `yaml:"datasources"`
	}
	b, err = os.ReadFile(filepath.Join(prov, "datasources/prometheus.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &ds); err != nil || len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://prometheus:9090" {
		t.Errorf("Grafana datasources %+v %v", ds, err)
	}
	var dp struct {
		Providers []struct {
			Options struct{ Path string } `yaml:"options"`
		} `yaml:"providers"`
	}
	b, err = os.ReadFile(filepath.Join(prov, "dashboards/kvindex.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &dp); err != nil || len(dp.Providers) != 1 {
		t.Fatalf("Grafana dashboard providers %+v %v", dp, err)
	}
	if mountedConfig(t, graf, dp.Providers[0].Options.Path+"/kvindex-dashboard.json") != mustAbs(t, filepath.Join(root, "deploy/helm/kvindex/files/kvindex-dashboard.json")) {
		t.Error("Grafana's dashboard is not the chart's")
	}
}

// TestComposeVLLMAgentsLearnCapacity: rendered alone, the vllm profile's
// agents never cap a real engine's cache below what it holds, and none of
// them reuses a simulated engine's agent config. A real engine's size is
// vLLM's num_gpu_blocks, fixed only when it starts (from free GPU memory)
// unless --num-gpu-blocks-override sets it; a cap below it makes
// SetCapacity evict blocks the GPU still serves, so the index under-reports
// hits on that engine. Without an override the agent must learn the size
// from the engine's first removals (no capacity_blocks, worker_capacity
// 0 or negative).
func TestComposeVLLMAgentsLearnCapacity(t *testing.T) {
	simConfigs := map[string]string{} // host file -> the sim service mounting it
	for name, s := range loadCompose(t, "sim").Services {
		if ours(s) && len(s.Command) > 0 && s.Command[0] == "agent" && slices.Contains(s.Profiles, "sim") {
			simConfigs[mountedConfig(t, s, argAfter(s.Command, "--config"))] = name
		}
	}
	if len(simConfigs) == 0 {
		t.Fatal("the sim profile has no agents to compare with")
	}
	p := loadCompose(t, "vllm")
	agents := 0
	for name, s := range p.Services {
		if !ours(s) || len(s.Command) == 0 || s.Command[0] != "agent" {
			continue
		}
		agents++
		if !slices.Contains(s.Profiles, "vllm") {
			t.Errorf("%s runs with the vllm profile but is not in it (profiles %v)", name, s.Profiles)
		}
		path := mountedConfig(t, s, argAfter(s.Command, "--config"))
		if sim, ok := simConfigs[path]; ok {
			t.Errorf("%s mounts %s, the simulated engine's agent config (%s's)", name, path, sim)
		}
		cfg, err := config.Load(path)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		pod, err := cfg.ValidateAgent()
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		capBlocks, field := pod.CapacityBlocks, "pods[].capacity_blocks"
		if capBlocks == 0 {
			capBlocks, field = cfg.Index.WorkerCapacity, "index.worker_capacity"
		}
		if capBlocks <= 0 {
			continue // learned from the engine's removals, or unbounded
		}
		engineName, _ := strings.CutPrefix(s.NetworkMode, "service:")
		engine, ok := p.Services[engineName]
		if !ok || ours(engine) {
			t.Errorf("%s: network_mode %q is not a real vLLM engine of the vllm profile", name, s.NetworkMode)
			continue
		}
		override := argAfter(engine.Command, "--num-gpu-blocks-override")
		if override == "" {
			t.Errorf("%s: %s %d caps %s's cache, whose size vLLM fixes only when it starts (no --num-gpu-blocks-override): leave it unset to learn it",
				name, field, capBlocks, engineName)
			continue
		}
		n, err := strconv.Atoi(override)
		if err != nil {
			t.Errorf("%s: --num-gpu-blocks-override %q: %v", engineName, override, err)
		} else if capBlocks < n {
			t.Errorf("%s: %s %d is below %s's --num-gpu-blocks-override %d", name, field, capBlocks, engineName, n)
		}
	}
	if agents != 3 {
		t.Errorf("the vllm profile runs %d agents, want one per engine (3)", agents)
	}
}

// testedVLLM is the vLLM release the deployment files run: one that
// publishes every wire form events/testdata's captures of vLLM's own
// publisher hold (map-era events, replay replies with a topic frame,
// offload tiers' locality, self-describing tier events: all merged before
// it). A later release is pinned together with a capture of its events.
const testedVLLM = "v0.30.0"

// TestVLLMImageIsTheTestedRelease: the compose vllm profile's engines and
// the Helm chart's example run testedVLLM, and the README names it, so
// that no file moves to a release the decoder has not been checked against
// without the others.
func TestVLLMImageIsTheTestedRelease(t *testing.T) {
	want := "vllm/vllm-openai:" + testedVLLM
	engines := 0
	for name, s := range loadCompose(t, "vllm").Services {
		if strings.HasPrefix(s.Image, "vllm/vllm-openai") {
			engines++
			if s.Image != want {
				t.Errorf("compose %s runs %s, want %s", name, s.Image, want)
			}
		}
	}
	if engines != 3 {
		t.Errorf("the vllm profile runs %d vLLM engines, want 3", engines)
	}
	for _, f := range []string{"deploy/helm/kvindex/examples/vllm-with-agent.yaml", "README.md"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if i := strings.Index(line, "vllm/vllm-openai:"); i >= 0 && !strings.Contains(line[i:], want) {
				t.Errorf("%s: %q, want %s", f, strings.TrimSpace(line), want)
			}
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s does not name %s", f, want)
		}
	}
}
