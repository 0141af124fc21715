// Package discovery finds the vLLM pods kvindex serve subscribes to in
// direct mode while it runs, so that a fleet that scales needs no static
// pods[] list.
//
// Two sources produce the same thing, a Snapshot of the pods that should
// be indexed now and why the others should not:
//
//   - Kubernetes watches pods matching a label selector with client-go's
//     shared informers; a pod counts when it is Running and Ready, has an
//     IP and is not terminating. Its ports, model, data-parallel size and
//     capacity come from annotations (AnnotationModel, ...), defaulting to
//     the configuration.
//   - DNS resolves a headless service's name every interval; each address
//     is a pod with the configured ports.
//
// InferencePool, for the endpoint picker, watches one Gateway API
// Inference Extension InferencePool with client-go's dynamic client and
// the pods its selector selects with a pod informer, and hands on their
// Endpoints (ip:port per rank) whenever they change.
//
// A Reconciler compares each snapshot with what it added before and calls
// its Fleet (the daemon) to add the pods that appeared and remove those
// that went, through the daemon's worker add and remove path (the index's
// AddWorker and RemoveWorker, the subscriber's AddEndpoint and
// RemoveEndpoint). Every change is counted by a bounded reason (Reason)
// and logged, so a pod that silently leaves the index is visible in
// kvindex_discovery_changes_total{change,reason}.
//
// # Concurrency
//
// A source's Run calls its Reconciler (InferencePool.Run its callback)
// from one goroutine; a Reconciler is applied from one goroutine at a
// time, and its counters (Collector, Counts, Pods) and InferencePool's
// (Errors, Excluded) may be read from any goroutine.
package discovery
