// Package discovery finds the vLLM pods kvindex serve subscribes to in
// direct mode while it runs, so that a fleet that scales needs no static
// pods[] list.
//
// Two sources produce a Snapshot of the pods to index now and why the
// others are not: Kubernetes (pods matching a label selector, Running,
// Ready and not terminating, configured by annotations) and DNS (a
// headless service's addresses, every interval). InferencePool, for the
// endpoint picker, watches one InferencePool and its pods and hands on
// their Endpoints. A Reconciler applies each snapshot to its Fleet (the
// daemon), counting every change by Reason in
// kvindex_discovery_changes_total{change,reason}.
// Both read Kubernetes through client-go's dynamic client (NewClient): the
// typed clientset would link every API group Kubernetes has.
//
// A build with -tags nokubernetes (make demo's) links no Kubernetes
// client: NewClient, NewKubernetes and NewInferencePool fail naming the
// tag, and config refuses discovery.kubernetes; DNS discovery, the
// Reconciler and the pure functions (PodFromKubernetes, PoolEndpoints)
// are the same in both builds.
package discovery
