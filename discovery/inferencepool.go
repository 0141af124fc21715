//go:build !nokubernetes

package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/internal/lograte"
)

// The InferencePool resources of the Gateway API Inference Extension, by
// config.InferencePool.APIVersion.
var (
	InferencePoolV1       = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
	InferencePoolV1Alpha2 = schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferencepools"}
)

// InferencePool watches one InferencePool and the pods its selector
// selects, and hands the endpoints of its Ready pods to a callback
// whenever they change. With one target port a pod serves every rank of
// its dp size there; with several, port i serves rank i. A missing or
// malformed pool has no endpoints; that and failed watches are counted
// (Errors) and logged at most once a minute. Run calls apply from its own goroutine, one call at a time; Errors and
// Excluded may be read from any goroutine.
type InferencePool struct {
	client   dynamic.Interface
	gvr      schema.GroupVersionResource
	ns, name string
	model    string
	dpSize   int
	resync   time.Duration
	log      *slog.Logger

	errors   atomic.Int64
	excluded atomic.Int64 // pods selected but not endpoints, at the last snapshot
	errLog   lograte.Limiter
}

// NewInferencePool returns a watcher of the pool cfg names and its pods
// through client (NewClient's); log may be nil. An empty cfg.Namespace is
// the namespace kvindex runs in.
func NewInferencePool(client dynamic.Interface, cfg *config.InferencePool, log *slog.Logger) (*InferencePool, error) {
	gvr := InferencePoolV1
	switch cfg.APIVersion {
	case config.InferencePoolV1, "":
	case config.InferencePoolV1Alpha2:
		gvr = InferencePoolV1Alpha2
	default:
		return nil, fmt.Errorf("discovery: inferencepool %q: api_version %q is not %s or %s", cfg.Name, cfg.APIVersion, config.InferencePoolV1, config.InferencePoolV1Alpha2)
	}
	ns, err := namespace(cfg.Namespace, fmt.Sprintf("inferencepool %q: namespace", cfg.Name))
	if err != nil {
		return nil, err
	}
	defaults.Zero(&log, slog.New(slog.DiscardHandler))
	return &InferencePool{client: client, gvr: gvr, ns: ns, name: cfg.Name, model: cfg.Model,
		dpSize: max(1, cfg.DPSize), resync: cfg.Resync, log: log}, nil
}

// NewClient returns a dynamic client of the API server: in the cluster
// from the pod's service account, outside it from kubeconfig.
func NewClient(kubeconfig string) (dynamic.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("discovery: kubernetes client (kubeconfig %q): %w", kubeconfig, err)
	}
	d, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("discovery: kubernetes dynamic client: %w", err)
	}
	return d, nil
}

// Errors counts failed watches and a missing or malformed pool.
func (w *InferencePool) Errors() int64 { return w.errors.Load() }

// Excluded is the number of selected pods that were not endpoints (not
// Ready, terminating, invalid annotations) at the last change.
func (w *InferencePool) Excluded() int64 { return w.excluded.Load() }

func (w *InferencePool) fail(err error) {
	w.errors.Add(1)
	if ok, suppressed := w.errLog.Allow(time.Now(), time.Minute); ok {
		w.log.Warn("inferencepool: the pool's endpoints may be out of date", "pool", w.ns+"/"+w.name, "err", err, "suppressed", suppressed)
	}
}

type podWatch struct {
	sel    string
	stop   func()
	lister func() ([]Pod, error)
}

func (p *podWatch) close() {
	if p != nil {
		p.stop()
	}
}

// Run watches the pool until ctx is done. It calls apply once the pool's
// informer has synced (with no endpoints if the pool is missing) and then
// whenever the endpoints change; eps is apply's to keep.
func (w *InferencePool) Run(ctx context.Context, apply func(eps []Endpoint)) error {
	kick, handler := kicker()
	inf := informer(w.client, w.gvr, w.ns, nil, w.resync)
	if _, err := inf.AddEventHandler(handler); err != nil {
		return fmt.Errorf("discovery: inferencepool informer: %w", err)
	}
	if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		w.fail(fmt.Errorf("watch %s in %s: %w", w.gvr.Resource, w.ns, err))
	}); err != nil {
		return fmt.Errorf("discovery: inferencepool informer: %w", err)
	}
	defer start(ctx, inf)()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	var pods *podWatch
	defer func() { pods.close() }()
	var last []Endpoint
	first := true
	for {
		eps, keep := w.endpoints(ctx, cache.NewGenericLister(inf.GetIndexer(), w.gvr.GroupResource()), &pods, handler)
		if !keep && (first || !slices.Equal(eps, last)) {
			apply(slices.Clone(eps))
			last, first = eps, false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		}
	}
}

// endpoints reads the pool and its pods; keep is true when they could not
// be read and the endpoints known should stay. It starts, replaces or
// stops *pods as the pool's selector requires.
func (w *InferencePool) endpoints(ctx context.Context, lister cache.GenericLister, pods **podWatch, h cache.ResourceEventHandler) (eps []Endpoint, keep bool) {
	obj, err := lister.ByNamespace(w.ns).Get(w.name)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			w.fail(fmt.Errorf("get %s %s/%s: %w", w.gvr.Resource, w.ns, w.name, err))
			return nil, true
		}
		w.fail(fmt.Errorf("%s %s/%s not found: no endpoints", w.gvr.Resource, w.ns, w.name))
		(*pods).close()
		*pods = nil
		return nil, false
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		w.fail(fmt.Errorf("%s %s/%s: unexpected object %T", w.gvr.Resource, w.ns, w.name, obj))
		return nil, true
	}
	sel, ports, err := ParsePoolSpec(u)
	if err != nil {
		w.fail(fmt.Errorf("%s %s/%s: %w: no endpoints", w.gvr.Resource, w.ns, w.name, err))
		(*pods).close()
		*pods = nil
		return nil, false
	}
	if *pods == nil || (*pods).sel != sel.String() {
		(*pods).close()
		if *pods, err = w.watchPods(ctx, sel, h); err != nil {
			w.fail(err)
			*pods = nil
			return nil, true
		}
	}
	list, err := (*pods).lister()
	if err != nil {
		w.fail(fmt.Errorf("list pods in %s (%s): %w", w.ns, sel, err))
		return nil, true
	}
	eps, excluded := PoolEndpoints(list, ports, w.model, w.dpSize)
	w.excluded.Store(int64(excluded))
	return eps, false
}

// watchPods starts a pod informer over sel and waits for its first list.
func (w *InferencePool) watchPods(ctx context.Context, sel labels.Selector, h cache.ResourceEventHandler) (*podWatch, error) {
	pctx, cancel := context.WithCancel(ctx)
	stop, lister, err := podInformer(pctx, w.client, w.resync, w.ns, sel, h, w.fail)
	pw := &podWatch{sel: sel.String(), stop: func() { cancel(); stop() }, lister: lister}
	if err != nil {
		pw.close()
		if pctx.Err() != nil {
			err = fmt.Errorf("discovery: pods in %s (%s): %w", w.ns, sel, errors.Join(context.Cause(pctx), ctx.Err()))
		}
		return nil, err
	}
	return pw, nil
}

// ParsePoolSpec reads an InferencePool's pod selector and target ports, in
// either API version: v1's selector.matchLabels (and matchExpressions)
// with targetPorts[].number, or v1alpha2's selector map with
// targetPortNumber. An empty selector, which would select every pod, is
// refused.
func ParsePoolSpec(u *unstructured.Unstructured) (labels.Selector, []int, error) {
	spec, ok := u.Object["spec"].(map[string]any)
	if !ok {
		return nil, nil, errors.New("no spec")
	}
	raw, ok := spec["selector"].(map[string]any)
	if !ok || len(raw) == 0 {
		return nil, nil, errors.New("spec.selector is missing or empty")
	}
	var sel labels.Selector
	var err error
	_, hasLabels := raw["matchLabels"]
	_, hasExprs := raw["matchExpressions"]
	if hasLabels || hasExprs {
		var ls metav1.LabelSelector
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &ls); err != nil {
			return nil, nil, fmt.Errorf("spec.selector: %w", err)
		}
		if len(ls.MatchLabels) == 0 && len(ls.MatchExpressions) == 0 {
			return nil, nil, errors.New("spec.selector is empty")
		}
		sel, err = metav1.LabelSelectorAsSelector(&ls)
	} else {
		set := labels.Set{}
		for k, v := range raw {
			s, ok := v.(string)
			if !ok {
				return nil, nil, fmt.Errorf("spec.selector.%s: %v is not a string", k, v)
			}
			set[k] = s
		}
		sel, err = labels.ValidatedSelectorFromSet(set)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("spec.selector: %w", err)
	}
	var ports []int
	if tp, ok := spec["targetPorts"].([]any); ok {
		for i, p := range tp {
			m, _ := p.(map[string]any)
			n, ok := portNumber(m["number"])
			if !ok {
				return nil, nil, fmt.Errorf("spec.targetPorts[%d].number: %v is not a port", i, m["number"])
			}
			ports = append(ports, n)
		}
	} else if v, present := spec["targetPortNumber"]; present {
		n, ok := portNumber(v)
		if !ok {
			return nil, nil, fmt.Errorf("spec.targetPortNumber: %v is not a port", v)
		}
		ports = []int{n}
	}
	if len(ports) == 0 {
		return nil, nil, errors.New("no target port (spec.targetPorts or spec.targetPortNumber)")
	}
	return sel, ports, nil
}

// portNumber is v as a port, whichever numeric type the decoder gave.
func portNumber(v any) (int, bool) {
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case int:
		n = int64(x)
	case int32:
		n = int64(x)
	case float64:
		if x != float64(int64(x)) {
			return 0, false
		}
		n = int64(x)
	default:
		return 0, false
	}
	return int(n), n >= 1 && n <= 65535
}
