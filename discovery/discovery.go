package discovery

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/internal/lograte"
)

// Reason says why a pod joined, left or was refused; a closed set, so the
// metric's reason label is bounded.
type Reason int

// The reasons.
const (
	// ReasonAppeared: the pod became Running and Ready, or resolved.
	ReasonAppeared Reason = iota
	// ReasonChanged: its address, ports, model or DP size changed; it
	// left and joined again.
	ReasonChanged
	// ReasonDeleted: the pod is gone from the API server.
	ReasonDeleted
	// ReasonNotRunning: its phase is not Running.
	ReasonNotRunning
	// ReasonNotReady: it is not Ready (or has no IP yet).
	ReasonNotReady
	// ReasonTerminating: it is being deleted.
	ReasonTerminating
	// ReasonUnresolved: the name no longer resolves to its address.
	ReasonUnresolved
	// ReasonInvalid: its annotations do not describe a valid pod.
	ReasonInvalid
	// ReasonFailed: the daemon could not add it (e.g. its name is a
	// configured pod's).
	ReasonFailed
	numReasons
)

var reasonNames = [numReasons]string{"appeared", "changed", "deleted", "not_running", "not_ready", "terminating", "unresolved", "invalid", "failed"}

// String is the reason's metric label.
func (r Reason) String() string { return label(r, reasonNames[:], "reason") }

// Change is what happened to a pod: it joined the index, left it, or was
// refused.
type Change int

// The changes.
const (
	// Join: the pod was added to the index.
	Join Change = iota
	// Leave: the pod was removed from the index.
	Leave
	// Refuse: the pod is seen but not indexed (invalid, or the daemon
	// could not add it).
	Refuse
	numChanges
)

var changeNames = [numChanges]string{"join", "leave", "refuse"}

// String is the change's metric label.
func (c Change) String() string { return label(c, changeNames[:], "change") }

// label is v's name in names, or kind(v) out of their range.
func label[T ~int](v T, names []string, kind string) string {
	if v < 0 || int(v) >= len(names) {
		return fmt.Sprintf("%s(%d)", kind, int(v))
	}
	return names[v]
}

// Snapshot is what a source sees at one moment.
type Snapshot struct {
	// Ready are the pods to index.
	Ready []config.Pod
	// Excluded are pods the source sees but that should not be indexed,
	// by name, with why.
	Excluded map[string]Reason
	// Gone is the reason of a pod that is in neither list (deleted,
	// unresolved).
	Gone Reason
}

// Fleet is the daemon's set of directly subscribed pods.
type Fleet interface {
	// AddPod subscribes to every DP rank of p and adds its workers to the
	// index; on error nothing of p is left behind.
	AddPod(p config.Pod) error
	// RemovePod unsubscribes from the pod named name and removes its
	// workers from the index.
	RemovePod(name string) error
}

// Reconciler turns snapshots into AddPod and RemovePod calls, counting
// every change by reason. Apply and Error are called from one goroutine
// at a time (the source's); its counters may be read from any goroutine,
// mu guarding current and refused against Pods.
type Reconciler struct {
	fleet Fleet
	log   *slog.Logger

	mu      sync.Mutex
	current map[string]config.Pod // added and not removed
	refused map[string]config.Pod // refused as it is now; counted once

	counts  [numChanges][numReasons]atomic.Int64
	errors  atomic.Int64
	errLog  lograte.Limiter
	every   time.Duration
	changes *prometheus.Desc
	errDesc *prometheus.Desc
	podDesc *prometheus.Desc
}

// NewReconciler returns a reconciler over fleet; log may be nil.
func NewReconciler(fleet Fleet, log *slog.Logger) *Reconciler {
	defaults.Zero(&log, slog.New(slog.DiscardHandler))
	return &Reconciler{
		fleet: fleet, log: log,
		current: map[string]config.Pod{}, refused: map[string]config.Pod{},
		every:   time.Minute,
		changes: prometheus.NewDesc("kvindex_discovery_changes_total", "Discovered pods that joined the index, left it or were refused, by reason: appeared, changed, deleted, not_running, not_ready, terminating, unresolved, invalid, failed.", []string{"change", "reason"}, nil),
		errDesc: prometheus.NewDesc("kvindex_discovery_errors_total", "Failed lookups of the discovery source (the pods known stay as they are).", nil, nil),
		podDesc: prometheus.NewDesc("kvindex_discovery_pods", "Discovered pods in the index.", nil, nil),
	}
}

// Apply makes the fleet hold exactly snap's ready pods: those that went
// are removed (counted under their exclusion reason, or snap.Gone), those
// that appeared are added, and those that changed are removed and added
// again. A pod that cannot be added is refused, counted once until it
// changes.
func (r *Reconciler) Apply(snap Snapshot) {
	ready := make(map[string]config.Pod, len(snap.Ready))
	for _, p := range snap.Ready {
		ready[p.Name] = p
	}
	r.mu.Lock()
	current := maps.Clone(r.current)
	r.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(current)) {
		p, ok := ready[name]
		if ok && p == current[name] {
			continue
		}
		why := ReasonChanged
		if !ok {
			why = snap.Gone
			if ex, seen := snap.Excluded[name]; seen {
				why = ex
			}
		}
		if err := r.fleet.RemovePod(name); err != nil {
			r.log.Error("discovered pod could not be removed", "pod", name, "reason", why.String(), "err", err)
		}
		r.set(name, nil)
		r.count(Leave, why)
		r.log.Info("discovered pod left the index", "pod", name, "reason", why.String())
	}
	for name, why := range snap.Excluded {
		if why == ReasonInvalid {
			r.refuse(config.Pod{Name: name}, why, nil)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(ready)) {
		p := ready[name]
		if _, ok := r.current[name]; ok {
			continue // unchanged (changed ones were removed above)
		}
		why := ReasonAppeared
		if old, ok := current[name]; ok && old != p {
			why = ReasonChanged
		}
		if err := r.fleet.AddPod(p); err != nil {
			r.refuse(p, ReasonFailed, err)
			continue
		}
		r.set(name, &p)
		r.count(Join, why)
		r.log.Info("discovered pod joined the index", "pod", name, "reason", why.String(), "endpoint", p.Endpoint, "dp_size", p.DPSize, "model", p.Model)
	}
	r.mu.Lock()
	for name := range r.refused {
		if _, ok := ready[name]; !ok && snap.Excluded[name] != ReasonInvalid {
			delete(r.refused, name)
		}
	}
	r.mu.Unlock()
}

func (r *Reconciler) set(name string, p *config.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p == nil {
		delete(r.current, name)
		return
	}
	r.current[name] = *p
	delete(r.refused, name)
}

// refuse counts and logs a refused pod, once for each state of it.
func (r *Reconciler) refuse(p config.Pod, why Reason, err error) {
	r.mu.Lock()
	old, seen := r.refused[p.Name]
	r.refused[p.Name] = p
	r.mu.Unlock()
	if seen && old == p {
		return
	}
	r.count(Refuse, why)
	r.log.Warn("discovered pod refused: it is not indexed", "pod", p.Name, "reason", why.String(), "err", err)
}

func (r *Reconciler) count(c Change, why Reason) { r.counts[c][why].Add(1) }

// Error counts a failed lookup of the source, logged at most once a
// minute; the pods already known are kept.
func (r *Reconciler) Error(err error) {
	r.errors.Add(1)
	if ok, _ := r.errLog.Allow(time.Now(), r.every); ok {
		r.log.Warn("pod discovery failed; the pods already discovered stay", "err", err)
	}
}

// Counts returns how many pods changed so, by reason.
func (r *Reconciler) Counts(c Change, why Reason) int64 { return r.counts[c][why].Load() }

// Errors counts failed lookups.
func (r *Reconciler) Errors() int64 { return r.errors.Load() }

// Pods returns the names of the pods added and not removed, sorted.
func (r *Reconciler) Pods() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.current))
}

// Describe implements prometheus.Collector.
func (r *Reconciler) Describe(ch chan<- *prometheus.Desc) {
	ch <- r.changes
	ch <- r.errDesc
	ch <- r.podDesc
}

// Collect implements prometheus.Collector: every (change, reason) pair,
// zeros included, so alerts see the series before the first change.
func (r *Reconciler) Collect(ch chan<- prometheus.Metric) {
	for c := range numChanges {
		for why := range numReasons {
			ch <- prometheus.MustNewConstMetric(r.changes, prometheus.CounterValue, float64(r.counts[c][why].Load()), c.String(), why.String())
		}
	}
	ch <- prometheus.MustNewConstMetric(r.errDesc, prometheus.CounterValue, float64(r.errors.Load()))
	ch <- prometheus.MustNewConstMetric(r.podDesc, prometheus.GaugeValue, float64(len(r.Pods())))
}
