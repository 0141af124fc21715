package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvindex/kvindex/config"
)

const chartDir = "helm/kvindex"

// manifests is a rendered chart, by kind, each object decoded strictly.
type manifests struct {
	deployments     []appsv1.Deployment
	services        []corev1.Service
	configMaps      []corev1.ConfigMap
	serviceAccounts []corev1.ServiceAccount
	pdbs            []policyv1.PodDisruptionBudget
	netpols         []networkingv1.NetworkPolicy
	roles           []rbacv1.Role
	bindings        []rbacv1.RoleBinding
	monitors        []monitoringv1.ServiceMonitor
	rules           []monitoringv1.PrometheusRule
	notes           string
}

// render renders the chart with Helm's Go SDK as `helm install kvindex -n
// inference -f valuesFile` would ("" for the default values), and decodes
// every manifest strictly (unknown or duplicate fields fail) into its
// Kubernetes API type.
func render(t *testing.T, valuesFile string) *manifests {
	t.Helper()
	vals := map[string]any{}
	if valuesFile != "" {
		var err error
		if vals, err = chartutil.ReadValuesFile(filepath.Join(chartDir, valuesFile)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := renderValues(t, vals)
	if err != nil {
		t.Fatalf("render %s: %v", valuesFile, err)
	}
	return m
}

// renderValues renders the chart as render does, with the values vals
// (YAML as chartutil reads it), returning the template error if any.
func renderValues(t *testing.T, vals map[string]any) (*manifests, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "kvindex", Namespace: "inference", IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	m := &manifests{}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			m.notes = out[name]
			continue
		}
		for i, doc := range strings.Split(out[name], "\n---") {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			m.decode(t, fmt.Sprintf("%s#%d", name, i), []byte(doc))
		}
	}
	return m, nil
}

func stripComments(doc string) string {
	var keep []string
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// decode decodes one manifest by its kind into its API type, strictly.
func (m *manifests) decode(t *testing.T, where string, doc []byte) {
	t.Helper()
	var head struct{ APIVersion, Kind string }
	if err := yaml.Unmarshal(doc, &head); err != nil {
		t.Fatalf("%s: %v\n%s", where, err, doc)
	}
	var target any
	switch head.APIVersion + " " + head.Kind {
	case "apps/v1 Deployment":
		m.deployments = append(m.deployments, appsv1.Deployment{})
		target = &m.deployments[len(m.deployments)-1]
	case "v1 Service":
		m.services = append(m.services, corev1.Service{})
		target = &m.services[len(m.services)-1]
	case "v1 ConfigMap":
		m.configMaps = append(m.configMaps, corev1.ConfigMap{})
		target = &m.configMaps[len(m.configMaps)-1]
	case "v1 ServiceAccount":
		m.serviceAccounts = append(m.serviceAccounts, corev1.ServiceAccount{})
		target = &m.serviceAccounts[len(m.serviceAccounts)-1]
	case "policy/v1 PodDisruptionBudget":
		m.pdbs = append(m.pdbs, policyv1.PodDisruptionBudget{})
		target = &m.pdbs[len(m.pdbs)-1]
	case "networking.k8s.io/v1 NetworkPolicy":
		m.netpols = append(m.netpols, networkingv1.NetworkPolicy{})
		target = &m.netpols[len(m.netpols)-1]
	case "rbac.authorization.k8s.io/v1 Role":
		m.roles = append(m.roles, rbacv1.Role{})
		target = &m.roles[len(m.roles)-1]
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		m.bindings = append(m.bindings, rbacv1.RoleBinding{})
		target = &m.bindings[len(m.bindings)-1]
	case "monitoring.coreos.com/v1 ServiceMonitor":
		m.monitors = append(m.monitors, monitoringv1.ServiceMonitor{})
		target = &m.monitors[len(m.monitors)-1]
	case "monitoring.coreos.com/v1 PrometheusRule":
		m.rules = append(m.rules, monitoringv1.PrometheusRule{})
		target = &m.rules[len(m.rules)-1]
	default:
		t.Fatalf("%s: unexpected %s %s", where, head.APIVersion, head.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, target); err != nil {
		t.Fatalf("%s (%s) does not decode strictly: %v\n%s", where, head.Kind, err, doc)
	}
}

func (m *manifests) configMap(t *testing.T, name string) *corev1.ConfigMap {
	t.Helper()
	for i := range m.configMaps {
		if m.configMaps[i].Name == name {
			return &m.configMaps[i]
		}
	}
	t.Fatalf("no ConfigMap %s", name)
	return nil
}

// replicaConfig parses and validates the replicas' kvindex.yaml.
func (m *manifests) replicaConfig(t *testing.T) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(m.configMap(t, "kvindex").Data["kvindex.yaml"]))
	if err != nil {
		t.Fatalf("the chart's kvindex.yaml: %v\n%s", err, m.configMap(t, "kvindex").Data["kvindex.yaml"])
	}
	return c
}

// checkReplicas checks what every rendering must have: one Deployment of
// non-root replicas probed over gRPC, serving the ConfigMap's ports, a
// Service, a PDB, a NetworkPolicy, a ServiceAccount.
func (m *manifests) checkReplicas(t *testing.T, cfg *config.Config) *corev1.Container {
	t.Helper()
	if len(m.deployments) != 1 || len(m.services) != 1 || len(m.pdbs) != 1 || len(m.netpols) != 1 || len(m.serviceAccounts) != 1 {
		t.Fatalf("deployments %d, services %d, PDBs %d, network policies %d, service accounts %d: want one each",
			len(m.deployments), len(m.services), len(m.pdbs), len(m.netpols), len(m.serviceAccounts))
	}
	d := m.deployments[0]
	sel := d.Spec.Selector.MatchLabels
	for what, labels := range map[string]map[string]string{
		"pod template": d.Spec.Template.Labels, "service selector": m.services[0].Spec.Selector,
		"PDB selector": m.pdbs[0].Spec.Selector.MatchLabels, "network policy": m.netpols[0].Spec.PodSelector.MatchLabels,
	} {
		for k, v := range sel {
			if labels[k] != v {
				t.Errorf("%s lacks the replicas' label %s=%s: %v", what, k, v, labels)
			}
		}
	}
	pod := d.Spec.Template.Spec
	if pod.ServiceAccountName != m.serviceAccounts[0].Name {
		t.Errorf("pods run as %q, the chart's service account is %q", pod.ServiceAccountName, m.serviceAccounts[0].Name)
	}
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot || *pod.SecurityContext.RunAsUser != 65532 {
		t.Errorf("pod security context %+v: want non-root 65532 (the image's user)", pod.SecurityContext)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := &pod.Containers[0]
	if !slices.Equal(c.Args, []string{"serve", "--config", "/etc/kvindex/kvindex.yaml"}) {
		t.Errorf("args %q", c.Args)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if fmt.Sprintf(":%d", ports["grpc"]) != cfg.GRPCListen || fmt.Sprintf(":%d", ports["metrics"]) != cfg.MetricsListen {
		t.Errorf("container ports %v, config listens on %s and %s", ports, cfg.GRPCListen, cfg.MetricsListen)
	}
	if c.ReadinessProbe == nil || c.LivenessProbe == nil {
		t.Fatal("no probes")
	}
	if !cfg.TLS.Enabled() && (c.ReadinessProbe.GRPC == nil || c.ReadinessProbe.GRPC.Port != ports["grpc"]) {
		t.Errorf("readiness probe %+v: want kubelet's gRPC health probe", c.ReadinessProbe)
	}
	if len(cfg.Auth.Tokens) > 0 && !cfg.Auth.OpenHealth {
		t.Error("tokens without auth.open_health: kubelet's probes would be refused")
	}
	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Errorf("container security context %+v", c.SecurityContext)
	}
	mounted := map[string]string{}
	for _, vm := range c.VolumeMounts {
		mounted[vm.Name] = vm.MountPath
	}
	if mounted["config"] != "/etc/kvindex/kvindex.yaml" {
		t.Errorf("config mounted at %q", mounted["config"])
	}
	for _, tok := range cfg.Auth.Tokens {
		if !strings.HasPrefix(tok.File, mounted["token-"+tok.Name]+"/") {
			t.Errorf("token %s read from %s, its Secret is mounted at %q", tok.Name, tok.File, mounted["token-"+tok.Name])
		}
	}
	if d.Spec.Template.Annotations["checksum/config"] == "" {
		t.Error("no config checksum: a changed configuration would not roll the replicas")
	}
	svcPorts := map[string]int32{}
	for _, p := range m.services[0].Spec.Ports {
		svcPorts[p.Name] = p.Port
		if p.TargetPort.StrVal != p.Name {
			t.Errorf("service port %s targets %v", p.Name, p.TargetPort)
		}
	}
	if svcPorts["grpc"] == 0 || svcPorts["metrics"] == 0 {
		t.Errorf("service ports %v", svcPorts)
	}
	np := m.netpols[0]
	guarded := map[string]bool{}
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			if p.Port != nil && (p.Port.String() == "grpc" || p.Port.String() == "metrics") {
				guarded[p.Port.String()] = len(r.From) > 0
			}
		}
	}
	if len(np.Spec.Ingress) < 2 || !guarded["grpc"] || !guarded["metrics"] {
		t.Errorf("network policy opens gRPC or metrics to anyone: %+v", np.Spec.Ingress)
	}
	return c
}

// TestChartDefaults: the default values render fleet-mode replicas whose
// configuration validates, with no RBAC at all (fleet mode reads no API).
func TestChartDefaults(t *testing.T) {
	m := render(t, "")
	cfg := m.replicaConfig(t)
	m.checkReplicas(t, cfg)
	if !cfg.NATS.Enabled() || cfg.Discovery.Enabled() || len(cfg.Pods) != 0 {
		t.Errorf("default config: nats %+v, discovery %+v, pods %v: want fleet mode", cfg.NATS, cfg.Discovery, cfg.Pods)
	}
	if len(m.roles)+len(m.bindings) != 0 {
		t.Error("fleet mode grants RBAC")
	}
	if pod := m.deployments[0].Spec.Template.Spec; pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("fleet-mode pods mount a service account token they never use")
	}
	if len(m.monitors)+len(m.rules) != 0 || len(m.configMaps) != 1 {
		t.Errorf("defaults render %d monitors, %d rules, %d config maps: want the config only", len(m.monitors), len(m.rules), len(m.configMaps))
	}
	if *m.deployments[0].Spec.Replicas != 2 || m.pdbs[0].Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("replicas %d, PDB min available %v", *m.deployments[0].Spec.Replicas, m.pdbs[0].Spec.MinAvailable)
	}
	if !strings.Contains(m.notes, "kvindexctl --addr localhost:50051 workers") {
		t.Errorf("NOTES: %s", m.notes)
	}
}

// TestChartSidecarExample: the worked fleet example renders replicas with
// tokens, the agents' ConfigMap (which parses and validates as an agent's
// configuration), the ServiceMonitor, the PrometheusRule (the alert rules
// file, unchanged) and the dashboard; examples/vllm-with-agent.yaml is a
// valid Deployment whose sidecar uses that ConfigMap.
func TestChartSidecarExample(t *testing.T) {
	m := render(t, "examples/sidecar-values.yaml")
	cfg := m.replicaConfig(t)
	m.checkReplicas(t, cfg)
	if len(cfg.Auth.Tokens) != 2 || cfg.Auth.Tokens[0].Name != "gateway" || !cfg.Auth.OpenHealth || cfg.Events.StaleAfterDisconnect.String() != "5s" {
		t.Errorf("auth %+v, events %+v", cfg.Auth, cfg.Events)
	}
	agentCM := m.configMap(t, "kvindex-agent")
	acfg, err := config.Parse([]byte(agentCM.Data["agent.yaml"]))
	if err != nil {
		t.Fatalf("agent.yaml: %v\n%s", err, agentCM.Data["agent.yaml"])
	}
	pod, err := acfg.ValidateAgent()
	if err != nil {
		t.Fatal(err)
	}
	if pod.Endpoint != "tcp://127.0.0.1:5557" || pod.ReplayEndpoint != "tcp://127.0.0.1:5567" || pod.CapacityBlocks != 30000 ||
		acfg.NATS.URL != cfg.NATS.URL || acfg.Agent.Checkpoint != "/var/lib/kvindex/agent.ckpt" || acfg.MetricsListen != ":9400" {
		t.Errorf("agent config %+v pod %+v", acfg, pod)
	}

	if len(m.monitors) != 1 || len(m.monitors[0].Spec.Endpoints) != 1 || m.monitors[0].Spec.Endpoints[0].Port != "metrics" ||
		!m.monitors[0].Spec.Endpoints[0].HonorLabels {
		t.Errorf("service monitor %+v: want the metrics port with honorLabels (kvindex's pod label)", m.monitors)
	}
	// /metrics takes the tokens: the monitor sends the read-only one.
	if a := m.monitors[0].Spec.Endpoints[0].Authorization; a == nil || a.Type != "Bearer" || a.Credentials == nil ||
		a.Credentials.Name != "kvindex-prometheus-token" || a.Credentials.Key != "token" {
		t.Errorf("service monitor authorization %+v: want the prometheus token's Secret", a)
	}
	if len(m.rules) != 1 {
		t.Fatalf("%d PrometheusRules", len(m.rules))
	}
	var file monitoringv1.PrometheusRuleSpec
	b, err := os.ReadFile(filepath.Join(chartDir, "files/kvindex-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &file); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(file, m.rules[0].Spec) || len(file.Groups) == 0 {
		t.Error("the PrometheusRule differs from files/kvindex-alerts.yaml")
	}
	dash := m.configMap(t, "kvindex-dashboard")
	want, err := os.ReadFile(filepath.Join(chartDir, "files/kvindex-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(dash.Data["kvindex-dashboard.json"]) != strings.TrimSpace(string(want)) || dash.Labels["grafana_dashboard"] != "1" {
		t.Error("the dashboard ConfigMap differs from files/kvindex-dashboard.json or lacks the sidecar's label")
	}

	// The vLLM pod manifest of the example.
	var vllm appsv1.Deployment
	b, err = os.ReadFile(filepath.Join(chartDir, "examples/vllm-with-agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &vllm); err != nil {
		t.Fatalf("examples/vllm-with-agent.yaml: %v", err)
	}
	var agent, engine *corev1.Container
	for i, c := range vllm.Spec.Template.Spec.Containers {
		switch c.Name {
		case "kvindex-agent":
			agent = &vllm.Spec.Template.Spec.Containers[i]
		case "vllm":
			engine = &vllm.Spec.Template.Spec.Containers[i]
		}
	}
	if agent == nil || engine == nil {
		t.Fatal("the example lacks the vllm or kvindex-agent container")
	}
	if !slices.Equal(agent.Args, []string{"agent", "--config", "/etc/kvindex/agent.yaml", "--pod-name", "$(POD_NAME)"}) ||
		len(agent.Env) != 1 || agent.Env[0].ValueFrom == nil || agent.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("agent args %q env %+v", agent.Args, agent.Env)
	}
	if want := m.deployments[0].Spec.Template.Spec.Containers[0].Image; agent.Image != want {
		t.Errorf("the sidecar runs %s, the chart %s", agent.Image, want)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range vllm.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	for _, vm := range agent.VolumeMounts {
		v := vols[vm.Name]
		switch {
		case vm.MountPath == "/etc/kvindex" && (v.ConfigMap == nil || v.ConfigMap.Name != agentCM.Name):
			t.Errorf("the sidecar's configuration is %+v, the chart renders ConfigMap %s", v, agentCM.Name)
		case strings.HasPrefix(acfg.Agent.Checkpoint, vm.MountPath+"/") && v.EmptyDir == nil:
			t.Errorf("the checkpoint's volume %s is not an emptyDir", vm.Name)
		}
	}
	kv := ""
	for _, a := range engine.Args {
		if v, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
			kv = v
		}
	}
	var kec struct {
		Enable         bool   `json:"enable_kv_cache_events"`
		Publisher      string `json:"publisher"`
		Endpoint       string `json:"endpoint"`
		ReplayEndpoint string `json:"replay_endpoint"`
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(kv)))
	if err := dec.Decode(&kec); err != nil || !kec.Enable || kec.Publisher != "zmq" ||
		kec.Endpoint != strings.Replace(pod.Endpoint, "127.0.0.1", "*", 1) || kec.ReplayEndpoint != strings.Replace(pod.ReplayEndpoint, "127.0.0.1", "*", 1) {
		t.Errorf("vLLM's --kv-events-config %q (%v) does not bind what the agent subscribes to (%s, %s)", kv, err, pod.Endpoint, pod.ReplayEndpoint)
	}
}

// TestChartDirectMode: direct mode with Kubernetes discovery configures
// discovery (valid), mounts the service account token, and grants a Role
// that can only get, list and watch pods in the discovery namespace; with
// DNS discovery there is no RBAC.
func TestChartDirectMode(t *testing.T) {
	m := render(t, "examples/direct-values.yaml")
	cfg := m.replicaConfig(t)
	m.checkReplicas(t, cfg)
	k := cfg.Discovery.Kubernetes
	if k == nil || k.Selector != "app=vllm" || k.Namespace != "inference" || k.Port != 5557 || k.ReplayPort != 5567 || k.MetricsPort != 8000 || cfg.NATS.Enabled() {
		t.Fatalf("discovery %+v, nats %+v", k, cfg.NATS)
	}
	if pod := m.deployments[0].Spec.Template.Spec; pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Error("Kubernetes discovery without the service account token")
	}
	if len(m.roles) != 1 || len(m.bindings) != 1 {
		t.Fatalf("%d roles, %d bindings", len(m.roles), len(m.bindings))
	}
	r := m.roles[0]
	if len(r.Rules) != 1 || !slices.Equal(r.Rules[0].APIGroups, []string{""}) || !slices.Equal(r.Rules[0].Resources, []string{"pods"}) ||
		!slices.Equal(r.Rules[0].Verbs, []string{"get", "list", "watch"}) || r.Namespace != "inference" {
		t.Errorf("role %+v: want get, list, watch of pods only", r)
	}
	b := m.bindings[0]
	if b.RoleRef.Name != r.Name || len(b.Subjects) != 1 || b.Subjects[0].Name != m.serviceAccounts[0].Name {
		t.Errorf("binding %+v", b)
	}

	m = render(t, "examples/dns-values.yaml")
	cfg = m.replicaConfig(t)
	m.checkReplicas(t, cfg)
	if d := cfg.Discovery.DNS; d == nil || d.Name != "vllm-headless.inference.svc.cluster.local" || cfg.Discovery.Kubernetes != nil {
		t.Fatalf("discovery %+v", cfg.Discovery)
	}
	if len(m.roles)+len(m.bindings) != 0 {
		t.Error("DNS discovery grants RBAC")
	}
}

// TestChartGateway: with gateway.enabled the replicas serve the endpoint
// picker for the named InferencePool (a valid configuration, the model's
// tokenizer URLs with it), the Deployment and Service expose its port, the
// network policy admits the gateway to it, and a second Role grants only
// get, list and watch of pods and inferencepools (both API groups).
func TestChartGateway(t *testing.T) {
	m := render(t, "examples/gateway-values.yaml")
	cfg := m.replicaConfig(t)
	m.checkReplicas(t, cfg)
	g := cfg.Gateway
	if g.Listen != ":9002" || g.InferencePool == nil || g.InferencePool.Name != "llama" || g.InferencePool.Namespace != "inference" ||
		g.InferencePool.APIVersion != config.InferencePoolV1 || g.InferencePool.Model != cfg.Models[0].Name || len(g.Endpoints) != 0 {
		t.Fatalf("gateway %+v, pool %+v", g, g.InferencePool)
	}
	if len(cfg.Models[0].TokenizerURLs) != 1 {
		t.Fatalf("tokenizer urls %v", cfg.Models[0].TokenizerURLs)
	}
	port := func(ports []corev1.ServicePort) bool {
		for _, p := range ports {
			if p.Name == "gateway" && p.Port == 9002 && p.TargetPort.String() == "gateway" {
				return true
			}
		}
		return false
	}
	if !port(m.services[0].Spec.Ports) {
		t.Errorf("service ports %+v: no gateway port", m.services[0].Spec.Ports)
	}
	pod := m.deployments[0].Spec.Template.Spec
	var exposed bool
	for _, p := range pod.Containers[0].Ports {
		exposed = exposed || (p.Name == "gateway" && p.ContainerPort == 9002)
	}
	if !exposed || pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Errorf("container ports %+v, automount %v", pod.Containers[0].Ports, pod.AutomountServiceAccountToken)
	}
	var admitted bool
	for _, r := range m.netpols[0].Spec.Ingress {
		for _, p := range r.Ports {
			admitted = admitted || (p.Port != nil && p.Port.String() == "gateway" && len(r.From) == 1)
		}
	}
	if !admitted {
		t.Errorf("network policy %+v: the gateway is not admitted to ext_proc", m.netpols[0].Spec.Ingress)
	}
	var gw *rbacv1.Role
	for i := range m.roles {
		if strings.HasSuffix(m.roles[i].Name, "-gateway") {
			gw = &m.roles[i]
		}
	}
	if gw == nil || len(m.roles) != 2 || len(m.bindings) != 2 || gw.Namespace != "inference" || len(gw.Rules) != 2 ||
		!slices.Equal(gw.Rules[0].Resources, []string{"pods"}) || !slices.Equal(gw.Rules[1].Resources, []string{"inferencepools"}) ||
		!slices.Equal(gw.Rules[1].APIGroups, []string{"inference.networking.k8s.io", "inference.networking.x-k8s.io"}) ||
		!slices.Equal(gw.Rules[0].Verbs, []string{"get", "list", "watch"}) || !slices.Equal(gw.Rules[1].Verbs, []string{"get", "list", "watch"}) {
		t.Fatalf("roles %+v: want the discovery role and a gateway role of get, list, watch on pods and inferencepools", m.roles)
	}
	if d := render(t, "examples/direct-values.yaml"); d.replicaConfig(t).Gateway.Enabled() || len(d.roles) != 1 {
		t.Error("the gateway is on without gateway.enabled")
	}
}

// TestChartHTTP: http.enabled serves the HTTP/JSON API: http_listen in the
// replicas' config, a container port, a Service port and an ingress rule
// from httpFrom (by default the same clients as gRPC); off by default.
func TestChartHTTP(t *testing.T) {
	if cfg := render(t, "").replicaConfig(t); cfg.HTTPListen != "" {
		t.Fatalf("http_listen %q by default: want off", cfg.HTTPListen)
	}
	m, err := renderValues(t, map[string]any{"http": map[string]any{"enabled": true, "port": 8081}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := m.replicaConfig(t)
	m.checkReplicas(t, cfg)
	if cfg.HTTPListen != ":8081" {
		t.Errorf("http_listen %q, want :8081", cfg.HTTPListen)
	}
	var svc, ctr, ingress bool
	for _, p := range m.services[0].Spec.Ports {
		svc = svc || (p.Name == "http" && p.Port == 8081 && p.TargetPort.String() == "http")
	}
	for _, p := range m.deployments[0].Spec.Template.Spec.Containers[0].Ports {
		ctr = ctr || (p.Name == "http" && p.ContainerPort == 8081)
	}
	for _, r := range m.netpols[0].Spec.Ingress {
		for _, p := range r.Ports {
			ingress = ingress || (p.Port != nil && p.Port.String() == "http" && len(r.From) == 1 &&
				r.From[0].PodSelector != nil && r.From[0].PodSelector.MatchLabels["kvindex.io/client"] == "true")
		}
	}
	if !svc || !ctr || !ingress {
		t.Errorf("service port %v, container port %v, ingress from the gRPC clients %v: want all", svc, ctr, ingress)
	}
}

// TestChartNATSTLS: nats.tls mounts its Secret in the replicas and points
// the replicas' and the agents' nats.tls at its files (the CA, and the
// client certificate for mTLS), with the server name; configurations that
// validate. Without it nothing is mounted; enabled without a Secret, or
// with nothing to use, the chart refuses to render.
func TestChartNATSTLS(t *testing.T) {
	vals := func(tls map[string]any) map[string]any {
		return map[string]any{
			"nats":  map[string]any{"url": "tls://nats.nats.svc:4222", "tls": tls},
			"agent": map[string]any{"enabled": true},
		}
	}
	m, err := renderValues(t, vals(map[string]any{"enabled": true, "secretName": "nats-client-tls", "clientCert": true, "serverName": "nats.nats.svc"}))
	if err != nil {
		t.Fatal(err)
	}
	cfg := m.replicaConfig(t)
	c := m.checkReplicas(t, cfg)
	acfg, err := config.Parse([]byte(m.configMap(t, "kvindex-agent").Data["agent.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	want := config.NATSTLS{CAFile: "/etc/kvindex/nats-tls/ca.crt", CertFile: "/etc/kvindex/nats-tls/tls.crt", KeyFile: "/etc/kvindex/nats-tls/tls.key", ServerName: "nats.nats.svc"}
	if cfg.NATS.TLS != want || acfg.NATS.TLS != want {
		t.Errorf("nats.tls: replicas %+v, agents %+v, want %+v", cfg.NATS.TLS, acfg.NATS.TLS, want)
	}
	mounted := ""
	for _, vm := range c.VolumeMounts {
		if vm.Name == "nats-tls" && vm.ReadOnly {
			mounted = vm.MountPath
		}
	}
	secret := ""
	for _, v := range m.deployments[0].Spec.Template.Spec.Volumes {
		if v.Name == "nats-tls" && v.Secret != nil {
			secret = v.Secret.SecretName
		}
	}
	if mounted == "" || filepath.Dir(want.CAFile) != mounted || secret != "nats-client-tls" {
		t.Errorf("Secret %q mounted at %q, the configuration reads %s", secret, mounted, filepath.Dir(want.CAFile))
	}

	// The CA alone (a server that does not verify clients).
	if m, err = renderValues(t, vals(map[string]any{"enabled": true, "secretName": "nats-ca"})); err != nil {
		t.Fatal(err)
	}
	if got := m.replicaConfig(t).NATS.TLS; got != (config.NATSTLS{CAFile: "/etc/kvindex/nats-tls/ca.crt"}) {
		t.Errorf("nats.tls with the CA alone: %+v", got)
	}
	// Off by default: nothing mounted.
	m = render(t, "")
	if got := m.replicaConfig(t).NATS.TLS; got.Enabled() {
		t.Errorf("nats.tls by default: %+v", got)
	}
	for _, v := range m.deployments[0].Spec.Template.Spec.Volumes {
		if v.Name == "nats-tls" {
			t.Error("the default values mount a nats-tls volume")
		}
	}
	for _, tc := range []struct {
		tls  map[string]any
		want string
	}{
		{map[string]any{"enabled": true}, "nats.tls.enabled needs nats.tls.secretName"},
		{map[string]any{"enabled": true, "secretName": "s", "ca": false}, "nats.tls.enabled needs nats.tls.ca, nats.tls.clientCert or nats.tls.serverName"},
	} {
		if _, err := renderValues(t, vals(tc.tls)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("nats.tls %v: %v, want %q", tc.tls, err, tc.want)
		}
	}
}

// TestChartLint runs Helm's own linter (`helm lint`) over the chart with
// the default values and every example's: no warning, no error.
func TestChartLint(t *testing.T) {
	for _, vf := range []string{"", "examples/sidecar-values.yaml", "examples/direct-values.yaml", "examples/dns-values.yaml", "examples/gateway-values.yaml"} {
		vals := map[string]any{}
		if vf != "" {
			var err error
			if vals, err = chartutil.ReadValuesFile(filepath.Join(chartDir, vf)); err != nil {
				t.Fatal(err)
			}
		}
		for _, m := range lint.All(chartDir, vals, "inference", false).Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint (%s): %s", vf, m.Error())
			}
		}
	}
}
