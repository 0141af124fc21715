//go:build !nokubernetes

package discovery

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/discovery/discoverytest"
)

func k8sPod(name, ip string, phase corev1.PodPhase, isReady bool, ann map[string]string) *corev1.Pod {
	cond := corev1.ConditionFalse
	if isReady {
		cond = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "inference", Labels: map[string]string{"app": "vllm"}, Annotations: ann},
		Status: corev1.PodStatus{Phase: phase, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: cond}}},
	}
}

var k8sDefaults = config.DiscoveredPods{Model: "m", Port: 5557, DPSize: 1}

// podOf is p as discovery reads it from the dynamic client: the typed pod
// made unstructured as the API server's JSON is, then PodFromUnstructured,
// so that the fields discovery reads are checked against the core API's
// own types.
func podOf(t *testing.T, p *corev1.Pod) Pod {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := PodFromUnstructured(&unstructured.Unstructured{Object: m})
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	return got
}

func TestPodFromUnstructured(t *testing.T) {
	del := metav1.Now()
	p := k8sPod("a", "10.0.0.1", corev1.PodRunning, true, map[string]string{AnnotationModel: "llama"})
	p.DeletionTimestamp = &del
	p.Status.Conditions = append([]corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}, p.Status.Conditions...)
	want := Pod{Name: "a", Namespace: "inference", Labels: map[string]string{"app": "vllm"}, Annotations: map[string]string{AnnotationModel: "llama"},
		Terminating: true, Phase: "Running", IP: "10.0.0.1", Ready: true}
	if got := podOf(t, p); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	p.DeletionTimestamp = nil
	p.Status.Conditions[1].Status = corev1.ConditionUnknown
	want.Terminating, want.Ready = false, false
	if got := podOf(t, p); !reflect.DeepEqual(got, want) {
		t.Fatalf("unknown readiness: got %+v, want %+v", got, want)
	}
	for name, status := range map[string]any{
		"phase not a string":      map[string]any{"phase": 3},
		"podIP not a string":      map[string]any{"podIP": true},
		"conditions not a list":   map[string]any{"conditions": "Ready"},
		"condition not an object": map[string]any{"conditions": []any{"Ready"}},
	} {
		u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "x", "namespace": "ns"}, "status": status}}
		if _, err := PodFromUnstructured(u); err == nil || !strings.Contains(err.Error(), "pod ns/x") {
			t.Errorf("%s: error %v, want one naming pod ns/x", name, err)
		}
	}
}

func TestPodFromKubernetes(t *testing.T) {
	del := metav1.Now()
	terminating := k8sPod("t", "10.0.0.1", corev1.PodRunning, true, nil)
	terminating.DeletionTimestamp = &del
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want config.Pod
		why  Reason
	}{
		{"defaults", k8sPod("a", "10.0.0.1", corev1.PodRunning, true, nil),
			config.Pod{Name: "a", Model: "m", Endpoint: "tcp://10.0.0.1:5557", DPSize: 1}, ReasonAppeared},
		{"annotations", k8sPod("b", "10.0.0.2", corev1.PodRunning, true, map[string]string{
			AnnotationModel: "llama", AnnotationPort: "6000", AnnotationReplayPort: "6010", AnnotationMetricsPort: "8000",
			AnnotationDPSize: "4", AnnotationCapacityBlocks: "30000"}),
			config.Pod{Name: "b", Model: "llama", Endpoint: "tcp://10.0.0.2:6000", ReplayEndpoint: "tcp://10.0.0.2:6010",
				MetricsURL: "http://10.0.0.2:8000/metrics", DPSize: 4, CapacityBlocks: 30000}, ReasonAppeared},
		{"ipv6", k8sPod("c", "fd00::5", corev1.PodRunning, true, nil),
			config.Pod{Name: "c", Model: "m", Endpoint: "tcp://[fd00::5]:5557", DPSize: 1}, ReasonAppeared},
		{"pending", k8sPod("d", "", corev1.PodPending, false, nil), config.Pod{}, ReasonNotRunning},
		{"not ready", k8sPod("e", "10.0.0.5", corev1.PodRunning, false, nil), config.Pod{}, ReasonNotReady},
		{"no ip", k8sPod("f", "", corev1.PodRunning, true, nil), config.Pod{}, ReasonNotReady},
		{"terminating", terminating, config.Pod{}, ReasonTerminating},
		{"bad port", k8sPod("g", "10.0.0.7", corev1.PodRunning, true, map[string]string{AnnotationPort: "x"}), config.Pod{}, ReasonInvalid},
		{"overlap", k8sPod("h", "10.0.0.8", corev1.PodRunning, true, map[string]string{AnnotationDPSize: "2", AnnotationReplayPort: "5558"}), config.Pod{}, ReasonInvalid},
		{"dp too big", k8sPod("i", "10.0.0.9", corev1.PodRunning, true, map[string]string{AnnotationDPSize: "5000"}), config.Pod{}, ReasonInvalid},
	} {
		got, why := PodFromKubernetes(podOf(t, tc.pod), k8sDefaults)
		if got != tc.want || why != tc.why {
			t.Errorf("%s: %+v %s, want %+v %s", tc.name, got, why, tc.want, tc.why)
		}
	}
}

// TestKubernetesInformers runs the watcher's real shared informers over
// client-go's fake dynamic client (no API server can run on these machines, so
// the fake's object tracker stands in for it; the informer, its list, its
// watch and its lister are client-go's own). Pods that become Running and
// Ready join; one that turns unready, one that changes IP and one deleted
// leave; pods outside the selector or namespace never join.
func TestKubernetesInformers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := discoverytest.New(
		k8sPod("vllm-0", "10.0.0.1", corev1.PodRunning, true, nil),
		k8sPod("vllm-1", "", corev1.PodPending, false, nil),
	)
	other := k8sPod("web-0", "10.0.0.50", corev1.PodRunning, true, nil)
	other.Labels = map[string]string{"app": "web"}
	elsewhere := k8sPod("vllm-x", "10.0.0.60", corev1.PodRunning, true, nil)
	elsewhere.Namespace = "other"
	pods := client.CoreV1().Pods("inference")
	mustCreate := func(p *corev1.Pod) {
		t.Helper()
		if _, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mustCreate(other)
	mustCreate(elsewhere)

	k, err := NewKubernetes(client, &config.KubernetesDiscovery{DiscoveredPods: k8sDefaults, Namespace: "inference", Selector: "app=vllm"})
	if err != nil {
		t.Fatal(err)
	}
	fl := &syncFleet{f: newFakeFleet()}
	r := NewReconciler(fl, nil)
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx, r) }()

	waitPods := func(what string, want ...string) map[string]config.Pod {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := fl.pods()
			var names []string
			for n := range got {
				names = append(names, n)
			}
			slices.Sort(names)
			if slices.Equal(names, want) {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: pods %v, want %v", what, names, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitPods("the first list", "vllm-0")

	// vllm-1 starts and becomes ready, with annotations.
	p1 := k8sPod("vllm-1", "10.0.0.2", corev1.PodRunning, true, map[string]string{AnnotationDPSize: "2", AnnotationReplayPort: "5567"})
	if _, err := pods.Update(ctx, p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := waitPods("vllm-1 ready", "vllm-0", "vllm-1")
	if got["vllm-1"].DPSize != 2 || got["vllm-1"].ReplayEndpoint != "tcp://10.0.0.2:5567" {
		t.Fatalf("vllm-1 from its annotations: %+v", got["vllm-1"])
	}

	// vllm-0 turns unready; vllm-1 is rescheduled at another IP.
	if _, err := pods.Update(ctx, k8sPod("vllm-0", "10.0.0.1", corev1.PodRunning, false, nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPods("vllm-0 unready", "vllm-1")
	p1.Status.PodIP = "10.0.0.3"
	if _, err := pods.Update(ctx, p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for fl.pods()["vllm-1"].Endpoint != "tcp://10.0.0.3:5557" {
		if time.Now().After(deadline) {
			t.Fatalf("vllm-1 not moved: %+v", fl.pods()["vllm-1"])
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := pods.Delete(ctx, "vllm-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPods("vllm-1 deleted")

	for _, tc := range []struct {
		c    Change
		why  Reason
		want int64
	}{
		{Join, ReasonAppeared, 2}, {Join, ReasonChanged, 1},
		{Leave, ReasonNotReady, 1}, {Leave, ReasonChanged, 1}, {Leave, ReasonDeleted, 1},
	} {
		if got := r.Counts(tc.c, tc.why); got != tc.want {
			t.Errorf("%s %s: %d, want %d", tc.c, tc.why, got, tc.want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
