// Package discoverytest is the stand-in API server of discovery's and the
// daemon's tests (no API server can run on the test machines): client-go's
// fake dynamic client, holding pods and InferencePools, with a typed pod
// client in the shape of the clientset's.
package discoverytest

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynfake "k8s.io/client-go/dynamic/fake"
)

// Client is a fake API server: a dynamic.Interface for discovery, and
// CoreV1().Pods(ns) to change its pods as a controller would.
type Client struct {
	*dynfake.FakeDynamicClient
}

// New returns a Client holding objs: typed pods and unstructured
// InferencePools (either API version discovery reads).
func New(objs ...runtime.Object) *Client {
	kinds := map[schema.GroupVersionResource]string{
		pods: "PodList",
		{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}:         "InferencePoolList",
		{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferencepools"}: "InferencePoolList",
	}
	for i, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			u, err := unstructuredPod(p)
			if err != nil {
				panic(err) // a Pod always converts
			}
			objs[i] = u
		}
	}
	// An empty scheme: every object is held and answered unstructured.
	return &Client{dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), kinds, objs...)}
}

// CoreV1 returns the client itself, so that tests read as with the
// typed clientset: c.CoreV1().Pods(ns).Create(...).
func (c *Client) CoreV1() *Client { return c }

// Pods returns ns's pods.
func (c *Client) Pods(ns string) Pods {
	return Pods{c.Resource(pods).Namespace(ns)}
}

var pods = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// Pods changes one namespace's pods, given typed.
type Pods struct {
	ri dynamic.ResourceInterface
}

// Create adds p.
func (p Pods) Create(ctx context.Context, pod *corev1.Pod, o metav1.CreateOptions) (*unstructured.Unstructured, error) {
	u, err := unstructuredPod(pod)
	if err != nil {
		return nil, err
	}
	return p.ri.Create(ctx, u, o)
}

// Update replaces the pod of p's name with p.
func (p Pods) Update(ctx context.Context, pod *corev1.Pod, o metav1.UpdateOptions) (*unstructured.Unstructured, error) {
	u, err := unstructuredPod(pod)
	if err != nil {
		return nil, err
	}
	return p.ri.Update(ctx, u, o)
}

// UpdateStatus replaces the status of the pod of p's name with p's.
func (p Pods) UpdateStatus(ctx context.Context, pod *corev1.Pod, o metav1.UpdateOptions) (*unstructured.Unstructured, error) {
	u, err := unstructuredPod(pod)
	if err != nil {
		return nil, err
	}
	return p.ri.UpdateStatus(ctx, u, o)
}

// Delete removes the pod named name.
func (p Pods) Delete(ctx context.Context, name string, o metav1.DeleteOptions) error {
	return p.ri.Delete(ctx, name, o)
}

func unstructuredPod(p *corev1.Pod) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		return nil, fmt.Errorf("discoverytest: pod %s: %w", p.Name, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion("v1")
	u.SetKind("Pod")
	return u, nil
}
