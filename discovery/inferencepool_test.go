//go:build !nokubernetes

package discovery

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/discovery/discoverytest"
)

// There is no API server here: the InferencePool tests run the watcher's
// real informers (list, then watch) against client-go's fake dynamic
// client (pods and the InferencePool custom resource),
// changing objects through the fakes as a controller would.

func poolObject(version schema.GroupVersionResource, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(version.GroupVersion().String())
	u.SetKind("InferencePool")
	u.SetNamespace("inference")
	u.SetName(name)
	return u
}

func v1Spec(labels map[string]any, ports ...int64) map[string]any {
	var tp []any
	for _, p := range ports {
		tp = append(tp, map[string]any{"number": p})
	}
	return map[string]any{"selector": map[string]any{"matchLabels": labels}, "targetPorts": tp,
		"endpointPickerRef": map[string]any{"name": "kvindex"}}
}

// poolRig runs a watcher and records every set of endpoints it applies.
type poolRig struct {
	t    *testing.T
	pods *discoverytest.Client
	dyn  *discoverytest.Client
	w    *InferencePool
	mu   sync.Mutex
	sets [][]Endpoint
}

func newPoolRig(t *testing.T, cfg config.InferencePool, objs ...runtime.Object) *poolRig {
	t.Helper()
	c := discoverytest.New(objs...)
	r := &poolRig{t: t, pods: c, dyn: c}
	cfg.Namespace = "inference"
	var err error
	if r.w, err = NewInferencePool(c, &cfg, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.w.Run(ctx, func(eps []Endpoint) {
			r.mu.Lock()
			r.sets = append(r.sets, eps)
			r.mu.Unlock()
		}); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// wait waits until the last endpoints applied are want.
func (r *poolRig) wait(what string, want []Endpoint) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		var last []Endpoint
		n := len(r.sets)
		if n > 0 {
			last = r.sets[n-1]
		}
		r.mu.Unlock()
		if n > 0 && slices.Equal(last, want) {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: endpoints %+v (%d sets), want %+v", what, last, n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitExcluded waits until the watcher counts want pods excluded.
func (r *poolRig) waitExcluded(what string, want int64) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.w.Excluded() != want {
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: excluded %d, want %d", what, r.w.Excluded(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *poolRig) addPod(p *corev1.Pod) {
	r.t.Helper()
	if _, err := r.pods.CoreV1().Pods("inference").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *poolRig) updatePod(p *corev1.Pod) {
	r.t.Helper()
	if _, err := r.pods.CoreV1().Pods("inference").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

// TestInferencePoolWatch: the pool's Ready pods are its endpoints as they
// come and go: a pod joins when Ready, leaves when not Ready or deleted,
// a pod the selector does not select is never one, annotations give the
// model and the DP size (every rank behind one address), a change of the
// pool's selector or port applies at once, and a deleted pool has none.
func TestInferencePoolWatch(t *testing.T) {
	pool := poolObject(InferencePoolV1, "vllm", v1Spec(map[string]any{"app": "vllm"}, 8000))
	r := newPoolRig(t, config.InferencePool{Name: "vllm", Model: "m", DPSize: 1}, pool)
	r.wait("no pods", nil)

	a := k8sPod("a", "10.0.0.1", corev1.PodRunning, true, nil)
	b := k8sPod("b", "10.0.0.2", corev1.PodRunning, false, map[string]string{AnnotationModel: "llama", AnnotationDPSize: "2"})
	other := k8sPod("x", "10.0.0.9", corev1.PodRunning, true, nil)
	other.Labels = map[string]string{"app": "other"}
	r.addPod(a)
	r.addPod(b)
	r.addPod(other)
	epA := Endpoint{Address: "10.0.0.1:8000", Pod: "a", Model: "m", DPSize: 1}
	r.wait("a ready, b not", []Endpoint{epA})
	// The endpoint set can be applied before the informer has delivered b:
	// wait for b's exclusion to be counted rather than reading it once.
	r.waitExcluded("b, not ready", 1)

	b.Status.Conditions[0].Status = corev1.ConditionTrue
	r.updatePod(b)
	epB := Endpoint{Address: "10.0.0.2:8000", Pod: "b", Model: "llama", AllRanks: true, DPSize: 2}
	r.wait("b ready", []Endpoint{epA, epB})

	a.Status.Conditions[0].Status = corev1.ConditionFalse
	r.updatePod(a)
	r.wait("a not ready", []Endpoint{epB})

	if err := r.pods.CoreV1().Pods("inference").Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wait("b deleted", nil)

	// The pool now selects app=other, on port 9000.
	a.Status.Conditions[0].Status = corev1.ConditionTrue
	r.updatePod(a)
	r.wait("a ready again", []Endpoint{epA})
	pool = poolObject(InferencePoolV1, "vllm", v1Spec(map[string]any{"app": "other"}, 9000))
	if _, err := r.dyn.Resource(InferencePoolV1).Namespace("inference").Update(context.Background(), pool, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wait("selector changed", []Endpoint{{Address: "10.0.0.9:9000", Pod: "x", Model: "m", DPSize: 1}})

	if err := r.dyn.Resource(InferencePoolV1).Namespace("inference").Delete(context.Background(), "vllm", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wait("pool deleted", nil)
	if r.w.Errors() == 0 {
		t.Fatal("a deleted pool was not counted")
	}
}

// TestInferencePoolAlpha2AndRanks: the v1alpha2 API's selector map and
// targetPortNumber are read; with several target ports each port is one
// rank of the pod; a pool created after the watcher started is found.
func TestInferencePoolAlpha2AndRanks(t *testing.T) {
	r := newPoolRig(t, config.InferencePool{Name: "late", APIVersion: config.InferencePoolV1Alpha2, Model: "m", DPSize: 1})
	r.wait("no pool yet", nil)
	r.addPod(k8sPod("a", "10.0.0.1", corev1.PodRunning, true, nil))
	pool := poolObject(InferencePoolV1Alpha2, "late", map[string]any{"selector": map[string]any{"app": "vllm"}, "targetPortNumber": int64(8000)})
	if _, err := r.dyn.Resource(InferencePoolV1Alpha2).Namespace("inference").Create(context.Background(), pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wait("pool created", []Endpoint{{Address: "10.0.0.1:8000", Pod: "a", Model: "m", DPSize: 1}})

	pool.Object["spec"] = map[string]any{"selector": map[string]any{"app": "vllm"}}
	pool.Object["spec"].(map[string]any)["targetPorts"] = []any{map[string]any{"number": int64(8000)}, map[string]any{"number": int64(8001)}}
	if _, err := r.dyn.Resource(InferencePoolV1Alpha2).Namespace("inference").Update(context.Background(), pool, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wait("two ports, two ranks", []Endpoint{
		{Address: "10.0.0.1:8000", Pod: "a", Model: "m", DPRank: 0, DPSize: 2},
		{Address: "10.0.0.1:8001", Pod: "a", Model: "m", DPRank: 1, DPSize: 2},
	})
}

func TestParsePoolSpec(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spec  map[string]any
		sel   string
		ports []int
		bad   bool
	}{
		{"v1", v1Spec(map[string]any{"app": "vllm"}, 8000), "app=vllm", []int{8000}, false},
		{"v1 expressions", map[string]any{"selector": map[string]any{"matchExpressions": []any{map[string]any{"key": "app", "operator": "In", "values": []any{"a", "b"}}}}, "targetPorts": []any{map[string]any{"number": float64(8000)}}}, "app in (a,b)", []int{8000}, false},
		{"v1alpha2", map[string]any{"selector": map[string]any{"app": "vllm"}, "targetPortNumber": int64(8080)}, "app=vllm", []int{8080}, false},
		{"no selector", map[string]any{"targetPortNumber": int64(8080)}, "", nil, true},
		{"empty matchLabels", v1Spec(map[string]any{}, 8000), "", nil, true},
		{"no port", map[string]any{"selector": map[string]any{"app": "vllm"}}, "", nil, true},
		{"port out of range", v1Spec(map[string]any{"app": "vllm"}, 70000), "", nil, true},
		{"selector value not a string", map[string]any{"selector": map[string]any{"app": int64(1)}, "targetPortNumber": int64(1)}, "", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sel, ports, err := ParsePoolSpec(poolObject(InferencePoolV1, "p", tc.spec))
			if tc.bad {
				if err == nil {
					t.Fatalf("accepted: %v %v", sel, ports)
				}
				return
			}
			if err != nil || sel.String() != tc.sel || !slices.Equal(ports, tc.ports) {
				t.Fatalf("got %v %v %v, want %s %v", sel, ports, err, tc.sel, tc.ports)
			}
		})
	}
}

func TestPoolEndpointsExcluded(t *testing.T) {
	bad := k8sPod("bad", "10.0.0.3", corev1.PodRunning, true, map[string]string{AnnotationDPSize: "x"})
	three := k8sPod("three", "10.0.0.4", corev1.PodRunning, true, map[string]string{AnnotationDPSize: "3"})
	eps, excluded := PoolEndpoints([]Pod{podOf(t, three), podOf(t, bad), podOf(t, k8sPod("ok", "10.0.0.5", corev1.PodRunning, true, nil))}, []int{8000, 8001}, "m", 1)
	want := []Endpoint{{Address: "10.0.0.5:8000", Pod: "ok", Model: "m", DPSize: 2}, {Address: "10.0.0.5:8001", Pod: "ok", Model: "m", DPRank: 1, DPSize: 2}}
	if !slices.Equal(eps, want) || excluded != 2 {
		t.Fatalf("got %+v, %d excluded; want %+v, 2 (a bad dp-size, a dp-size two ports contradict)", eps, excluded, want)
	}
}
