package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/discovery"
	"github.com/kvindex/kvindex/discovery/discoverytest"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/netutil"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// unreachableKubeconfig names an API server that is not there: New builds
// real clients from it, and the tests swap in client-go's fake (no API
// server can run here; the informers, list, watch and listers are
// client-go's own).
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"+
		"contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {token: x}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc
}

func readyPod(name, ip string, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "inference", Labels: map[string]string{"app": "vllm"}, Annotations: ann},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

// runDaemon runs d until the test ends.
func runDaemon(t *testing.T, d *Daemon) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func addresses(p *picker.Picker) []string {
	var out []string
	for _, e := range p.Endpoints() {
		out = append(out, e.Address+"="+e.Worker.String())
	}
	slices.Sort(out)
	return out
}

// TestGatewayInferencePool runs the daemon with gateway.inference_pool
// over client-go's fake dynamic client (discoverytest): the pool's
// Ready pods become the picker's endpoints, every rank of a DP pod
// included, each a cold worker of the index (kvindex hears nothing from
// them); a pod that stops being Ready leaves the picker and its cold
// workers leave the index.
func TestGatewayInferencePool(t *testing.T) {
	cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "off",
		Models: []config.Model{{Name: "m"}},
		Gateway: config.Gateway{Listen: "127.0.0.1:0",
			InferencePool: &config.InferencePool{Name: "vllm", Namespace: "inference", Kubeconfig: unreachableKubeconfig(t)}}}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"selector": map[string]any{"matchLabels": map[string]any{"app": "vllm"}}, "targetPorts": []any{map[string]any{"number": int64(8000)}}}}}
	pool.SetAPIVersion("inference.networking.k8s.io/v1")
	pool.SetKind("InferencePool")
	pool.SetNamespace("inference")
	pool.SetName("vllm")
	a := readyPod("a", "10.0.0.1", nil)
	client := discoverytest.New(pool, a, readyPod("b", "10.0.0.2", map[string]string{discovery.AnnotationDPSize: "2"}))
	if d.gwSource, err = discovery.NewInferencePool(client, cfg.Gateway.InferencePool, nil); err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	want := []string{"10.0.0.1:8000=a/0", "10.0.0.2:8000=b/0", "10.0.0.2:8000=b/1"}
	waitFor(t, "the pool's pods to be the picker's endpoints", func() bool { return slices.Equal(addresses(d.Picker()), want) })
	for _, ref := range []events.WorkerRef{{Pod: "a"}, {Pod: "b"}, {Pod: "b", DPRank: 1}} {
		w := d.Index().LookupWorker(ref)
		if w == nil || w.Info().Endpoint != coldEndpoint {
			t.Fatalf("worker %s: %v, want a cold worker", ref, w)
		}
	}
	a.Status.Conditions[0].Status = corev1.ConditionFalse
	if _, err := client.CoreV1().Pods("inference").UpdateStatus(context.Background(), a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unready pod to leave the picker", func() bool { return slices.Equal(addresses(d.Picker()), want[1:]) })
	if w := d.Index().LookupWorker(events.WorkerRef{Pod: "a"}); w != nil {
		t.Fatalf("a's cold worker stayed in the index: %v", w.Info())
	}
}

// TestGatewayDiscoveredPort runs the daemon with discovery.kubernetes and
// gateway.discovered_port: a discovered pod is an endpoint at its IP and
// that port, its worker the discovered (not a cold) one; when it leaves
// discovery it leaves the picker.
func TestGatewayDiscoveredPort(t *testing.T) {
	cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "off",
		Discovery: config.Discovery{Kubernetes: &config.KubernetesDiscovery{Kubeconfig: unreachableKubeconfig(t), Namespace: "inference", Selector: "app=vllm",
			DiscoveredPods: config.DiscoveredPods{Model: "m"}}},
		Gateway: config.Gateway{Listen: "127.0.0.1:0", DiscoveredPort: 8000}}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := readyPod("vllm-0", "127.0.0.1", nil)
	client := discoverytest.New(pod)
	if d.discovery, err = discovery.NewKubernetes(client, cfg.Discovery.Kubernetes); err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	waitFor(t, "the discovered pod to be an endpoint", func() bool {
		return slices.Equal(addresses(d.Picker()), []string{"127.0.0.1:8000=vllm-0/0"})
	})
	if w := d.Index().LookupWorker(events.WorkerRef{Pod: "vllm-0"}); w == nil || w.Info().Endpoint == coldEndpoint {
		t.Fatalf("worker %v, want the discovered one", w)
	}
	if err := client.CoreV1().Pods("inference").Delete(context.Background(), "vllm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted pod to leave the picker and the index", func() bool {
		return len(d.Picker().Endpoints()) == 0 && d.Index().LookupWorker(events.WorkerRef{Pod: "vllm-0"}) == nil
	})
}

// TestGatewayPoolWithDiscovery runs both over the same fake dynamic client:
// discovery.kubernetes subscribes to the pod's engine and
// gateway.inference_pool makes it an endpoint. Whichever sees the pod
// first, the endpoint's worker ends as the discovered one, holding the
// engine's blocks (a cold worker, if the pool was first, gives way); when
// the pod stops being Ready it leaves both the picker and the index.
func TestGatewayPoolWithDiscovery(t *testing.T) {
	port, err := netutil.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{
		Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port), ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port+1), Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	toks := make([]uint32, 64)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	if _, err := pub.Publish(&events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{1, 2, 3, 4}, TokenIDs: toks, BlockSize: 16}}}); err != nil {
		t.Fatal(err)
	}
	kc := unreachableKubeconfig(t)
	cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "off",
		Models: []config.Model{{Name: "m"}},
		Discovery: config.Discovery{Kubernetes: &config.KubernetesDiscovery{Kubeconfig: kc, Namespace: "inference", Selector: "app=vllm",
			DiscoveredPods: config.DiscoveredPods{Model: "m"}}},
		Gateway: config.Gateway{Listen: "127.0.0.1:0", InferencePool: &config.InferencePool{Name: "vllm", Namespace: "inference", Kubeconfig: kc}}}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"selector": map[string]any{"matchLabels": map[string]any{"app": "vllm"}}, "targetPorts": []any{map[string]any{"number": int64(8000)}}}}}
	pool.SetAPIVersion("inference.networking.k8s.io/v1")
	pool.SetKind("InferencePool")
	pool.SetNamespace("inference")
	pool.SetName("vllm")
	pod := readyPod("vllm-0", "127.0.0.1", map[string]string{discovery.AnnotationPort: fmt.Sprint(port), discovery.AnnotationReplayPort: fmt.Sprint(port + 1)})
	client := discoverytest.New(pool, pod)
	if d.discovery, err = discovery.NewKubernetes(client, cfg.Discovery.Kubernetes); err != nil {
		t.Fatal(err)
	}
	if d.gwSource, err = discovery.NewInferencePool(client, cfg.Gateway.InferencePool, nil); err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	ref := events.WorkerRef{Pod: "vllm-0"}
	waitFor(t, "the endpoint's worker to be the discovered one, holding 4 blocks", func() bool {
		w := d.Index().LookupWorker(ref)
		return w != nil && w.Info().Endpoint != coldEndpoint && w.Stats().ResidentBlocks == 4 &&
			slices.Equal(addresses(d.Picker()), []string{"127.0.0.1:8000=vllm-0/0"})
	})
	pod.Status.Conditions[0].Status = corev1.ConditionFalse
	if _, err := client.CoreV1().Pods("inference").UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unready pod to leave the picker and the index", func() bool {
		return len(d.Picker().Endpoints()) == 0 && d.Index().LookupWorker(ref) == nil
	})
}
