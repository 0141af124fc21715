//go:build !nokubernetes

package discovery

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/kvindex/kvindex/config"
)

// serviceAccountNamespace is where Kubernetes mounts the pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// Pods is the core API's pods resource. Discovery reads pods, as it reads
// InferencePools, through client-go's dynamic client, and takes the few
// fields it needs from the unstructured objects (Pod): the typed clientset
// and its informer factory link every API group Kubernetes has (about 320
// more packages, a third of kvindex's binary), and the core API's types
// alone (k8s.io/api/core/v1) 4 MB of it, for seven fields of one resource.
var Pods = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// PodFromUnstructured reads a Pod from the core API's pod object u (as
// the dynamic client returns it); a field of the wrong type is an error.
func PodFromUnstructured(u *unstructured.Unstructured) (Pod, error) {
	p := Pod{Name: u.GetName(), Namespace: u.GetNamespace(), Labels: u.GetLabels(), Annotations: u.GetAnnotations(),
		Terminating: u.GetDeletionTimestamp() != nil}
	var err error
	if p.Phase, _, err = unstructured.NestedString(u.Object, "status", "phase"); err != nil {
		return Pod{}, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	if p.IP, _, err = unstructured.NestedString(u.Object, "status", "podIP"); err != nil {
		return Pod{}, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	conds, _, err := unstructured.NestedSlice(u.Object, "status", "conditions")
	if err != nil {
		return Pod{}, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	for i, c := range conds {
		m, ok := c.(map[string]any)
		if !ok {
			return Pod{}, fmt.Errorf("pod %s/%s: status.conditions[%d] is %T, not an object", p.Namespace, p.Name, i, c)
		}
		if m["type"] == "Ready" {
			p.Ready = m["status"] == "True"
		}
	}
	return p, nil
}

// Kubernetes watches pods through the API server with a client-go shared
// informer (one list, then a watch; no polling).
type Kubernetes struct {
	client   dynamic.Interface
	ns       string
	selector labels.Selector
	defaults config.DiscoveredPods
	resync   time.Duration
}

// NewKubernetes returns a watcher of the pods cfg selects through client
// (NewClient's). An empty cfg.Namespace is the namespace kvindex runs in.
func NewKubernetes(client dynamic.Interface, cfg *config.KubernetesDiscovery) (*Kubernetes, error) {
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("discovery: selector %q: %w", cfg.Selector, err)
	}
	ns, err := namespace(cfg.Namespace, "kubernetes.namespace")
	if err != nil {
		return nil, err
	}
	return &Kubernetes{client: client, ns: ns, selector: sel, defaults: cfg.DiscoveredPods, resync: cfg.Resync}, nil
}

// namespace is ns, or when it is empty the namespace kvindex runs in (from
// its service account); field names ns in the error.
func namespace(ns, field string) (string, error) {
	if ns != "" {
		return ns, nil
	}
	b, err := os.ReadFile(serviceAccountNamespace)
	if err != nil {
		return "", fmt.Errorf("discovery: %s is empty and the service account's namespace cannot be read: %w", field, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// kicker returns a channel that holds one token after any informer event
// (a snapshot is due), and the handler that fills it.
func kicker() (chan struct{}, cache.ResourceEventHandlerFuncs) {
	kick := make(chan struct{}, 1)
	notify := func(any) {
		select {
		case kick <- struct{}{}:
		default: // a snapshot is due already
		}
	}
	return kick, cache.ResourceEventHandlerFuncs{AddFunc: notify, UpdateFunc: func(_, n any) { notify(n) }, DeleteFunc: notify}
}

// informer returns an informer of resource gvr's objects in ns that sel
// selects (every one when sel is nil), as unstructured objects.
func informer(client dynamic.Interface, gvr schema.GroupVersionResource, ns string, sel labels.Selector, resync time.Duration) cache.SharedIndexInformer {
	ri := client.Resource(gvr).Namespace(ns)
	opts := func(o metav1.ListOptions) metav1.ListOptions {
		if sel != nil {
			o.LabelSelector = sel.String()
		}
		return o
	}
	// With the client's watch-list support (a fake client has none), as
	// client-go's own informers are made.
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return ri.List(ctx, opts(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return ri.Watch(ctx, opts(o))
		},
	}, client)
	return cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, resync, cache.Indexers{})
}

// start runs inf until ctx is done or the returned stop is called; stop
// returns once the informer has stopped.
func start(ctx context.Context, inf cache.SharedIndexInformer) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		inf.RunWithContext(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// podInformer starts an informer of the pods sel selects in ns, handing
// events to h and watch errors to fail, and waits for its first list. The
// caller calls stop, on error too. list reads the informer's objects as
// pods: O(pods) at each call, off the Score path.
func podInformer(ctx context.Context, client dynamic.Interface, resync time.Duration, ns string, sel labels.Selector,
	h cache.ResourceEventHandler, fail func(error)) (stop func(), list func() ([]Pod, error), err error) {
	inf := informer(client, Pods, ns, sel, resync)
	list = func() ([]Pod, error) {
		var pods []Pod
		for _, o := range inf.GetStore().List() {
			u, ok := o.(*unstructured.Unstructured)
			if !ok {
				return nil, fmt.Errorf("pod informer: unexpected object %T", o)
			}
			p, err := PodFromUnstructured(u)
			if err != nil {
				return nil, err
			}
			if p.Namespace == ns && sel.Matches(labels.Set(p.Labels)) {
				pods = append(pods, p)
			}
		}
		return pods, nil
	}
	stop = func() {}
	if _, err := inf.AddEventHandler(h); err != nil {
		return stop, list, fmt.Errorf("discovery: pod informer (%s): %w", sel, err)
	}
	if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		fail(fmt.Errorf("watch pods in %s (%s): %w", ns, sel, err))
	}); err != nil {
		return stop, list, fmt.Errorf("discovery: pod informer (%s): %w", sel, err)
	}
	stop = start(ctx, inf)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return stop, list, ctx.Err()
	}
	return stop, list, nil
}

// Run lists and watches the pods until ctx is done, applying a snapshot
// to r after the first list and after every change the informer reports.
func (k *Kubernetes) Run(ctx context.Context, r *Reconciler) error {
	kick, h := kicker()
	stop, lister, err := podInformer(ctx, k.client, k.resync, k.ns, k.selector, h, r.Error)
	defer stop()
	if err != nil {
		return err
	}
	for {
		list, err := lister()
		if err != nil {
			r.Error(fmt.Errorf("list pods in %s (%s): %w", k.ns, k.selector, err))
		} else {
			snap := Snapshot{Excluded: map[string]Reason{}, Gone: ReasonDeleted}
			for _, p := range list {
				if pod, why := PodFromKubernetes(p, k.defaults); why == ReasonAppeared {
					snap.Ready = append(snap.Ready, pod)
				} else {
					snap.Excluded[p.Name] = why
				}
			}
			r.Apply(snap)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		}
	}
}
