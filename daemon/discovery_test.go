package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/discovery"
	"github.com/kvindex/kvindex/discovery/discoverytest"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/netutil"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// TestKubernetesDiscoveryJoinsAndLeaves runs the daemon with
// discovery.kubernetes over client-go's fake dynamic client (no API server can
// run on these machines; the informers, their list, watch and lister are
// client-go's own): a Running and Ready pod whose IP is loopback joins
// the index and learns its engine's blocks over real ZeroMQ, with the
// ports its annotations give; turned unready it leaves, counted.
func TestKubernetesDiscoveryJoinsAndLeaves(t *testing.T) {
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

	// A kubeconfig naming an API server that is not there: New builds a
	// real client from it; the test then swaps in the fake dynamic client.
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"+
		"contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {token: x}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0",
		Discovery: config.Discovery{Kubernetes: &config.KubernetesDiscovery{Kubeconfig: kc, Namespace: "inference", Selector: "app=vllm",
			DiscoveredPods: config.DiscoveredPods{Model: "m"}}}}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm-0", Namespace: "inference", Labels: map[string]string{"app": "vllm"},
			Annotations: map[string]string{discovery.AnnotationPort: fmt.Sprint(port), discovery.AnnotationReplayPort: fmt.Sprint(port + 1)}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	client := discoverytest.New(pod)
	if d.discovery, err = discovery.NewKubernetes(client, cfg.Discovery.Kubernetes); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	ref := events.WorkerRef{Pod: "vllm-0"}
	wait("the pod to join and learn its 4 blocks", func() bool {
		w := d.Index().LookupWorker(ref)
		return w != nil && w.Stats().ResidentBlocks == 4
	})
	pod.Status.Conditions[0].Status = corev1.ConditionFalse
	if _, err := client.CoreV1().Pods("inference").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("the unready pod to leave", func() bool { return d.Index().LookupWorker(ref) == nil && d.Subscriber().Health(ref) == nil })
	if got := d.reconciler.Counts(discovery.Leave, discovery.ReasonNotReady); got != 1 {
		t.Fatalf("leave/not_ready = %d", got)
	}
}
