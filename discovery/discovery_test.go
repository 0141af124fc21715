package discovery

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/config"
)

// fakeFleet records the daemon calls a Reconciler makes.
type fakeFleet struct {
	pods  map[string]config.Pod
	calls []string
	fail  map[string]bool // AddPod of these names fails
}

func newFakeFleet() *fakeFleet {
	return &fakeFleet{pods: map[string]config.Pod{}, fail: map[string]bool{}}
}

func (f *fakeFleet) AddPod(p config.Pod) error {
	f.calls = append(f.calls, "add "+p.Name)
	if f.fail[p.Name] {
		return fmt.Errorf("worker %s/0 exists", p.Name)
	}
	if _, ok := f.pods[p.Name]; ok {
		return errors.New("added twice")
	}
	f.pods[p.Name] = p
	return nil
}

func (f *fakeFleet) RemovePod(name string) error {
	f.calls = append(f.calls, "remove "+name)
	if _, ok := f.pods[name]; !ok {
		return errors.New("not there")
	}
	delete(f.pods, name)
	return nil
}

func pod(name, ip string) config.Pod {
	return config.Pod{Name: name, Model: "m", Endpoint: "tcp://" + ip + ":5557", DPSize: 1}
}

func (f *fakeFleet) takeCalls() []string {
	c := f.calls
	f.calls = nil
	return c
}

// TestReconcilerChanges: every join, leave and refusal reaches the fleet
// once and is counted under its reason.
func TestReconcilerChanges(t *testing.T) {
	f := newFakeFleet()
	r := NewReconciler(f, nil)
	r.Apply(Snapshot{Ready: []config.Pod{pod("a", "10.0.0.1"), pod("b", "10.0.0.2")}, Gone: ReasonDeleted})
	if got := f.takeCalls(); !slices.Equal(got, []string{"add a", "add b"}) {
		t.Fatalf("first snapshot: %v", got)
	}
	// Unchanged: nothing happens.
	r.Apply(Snapshot{Ready: []config.Pod{pod("b", "10.0.0.2"), pod("a", "10.0.0.1")}, Gone: ReasonDeleted})
	if got := f.takeCalls(); len(got) != 0 {
		t.Fatalf("same snapshot: %v", got)
	}
	// a not ready, b's address changed, c appears, d fails, e invalid.
	f.fail["d"] = true
	snap := Snapshot{
		Ready:    []config.Pod{pod("b", "10.0.0.9"), pod("c", "10.0.0.3"), pod("d", "10.0.0.4")},
		Excluded: map[string]Reason{"a": ReasonNotReady, "e": ReasonInvalid},
		Gone:     ReasonDeleted,
	}
	r.Apply(snap)
	if got := f.takeCalls(); !slices.Equal(got, []string{"remove a", "remove b", "add b", "add c", "add d"}) {
		t.Fatalf("second snapshot: %v", got)
	}
	if f.pods["b"].Endpoint != "tcp://10.0.0.9:5557" {
		t.Fatalf("b re-added at %s", f.pods["b"].Endpoint)
	}
	// The same snapshot again: d is retried, but neither it nor e is
	// counted twice.
	r.Apply(snap)
	if got := f.takeCalls(); !slices.Equal(got, []string{"add d"}) {
		t.Fatalf("repeated snapshot: %v", got)
	}
	// Everything goes.
	r.Apply(Snapshot{Gone: ReasonDeleted})
	if got := f.takeCalls(); !slices.Equal(got, []string{"remove b", "remove c"}) {
		t.Fatalf("empty snapshot: %v", got)
	}
	for _, tc := range []struct {
		c    Change
		why  Reason
		want int64
	}{
		{Join, ReasonAppeared, 3}, {Join, ReasonChanged, 1},
		{Leave, ReasonNotReady, 1}, {Leave, ReasonChanged, 1}, {Leave, ReasonDeleted, 2},
		{Refuse, ReasonFailed, 1}, {Refuse, ReasonInvalid, 1},
	} {
		if got := r.Counts(tc.c, tc.why); got != tc.want {
			t.Errorf("%s %s: %d, want %d", tc.c, tc.why, got, tc.want)
		}
	}
	if len(r.Pods()) != 0 {
		t.Fatalf("pods left: %v", r.Pods())
	}
}

// TestCollector exports every (change, reason) pair, zeros included, and
// the error count and pod gauge.
func TestCollector(t *testing.T) {
	f := newFakeFleet()
	r := NewReconciler(f, nil)
	r.Apply(Snapshot{Ready: []config.Pod{pod("a", "10.0.0.1")}})
	r.Error(errors.New("lookup failed"))
	reg := prometheus.NewRegistry()
	reg.MustRegister(r)
	if n := testutil.CollectAndCount(r, "kvindex_discovery_changes_total"); n != int(numChanges)*int(numReasons) {
		t.Fatalf("%d change series, want %d", n, int(numChanges)*int(numReasons))
	}
	want := `# HELP kvindex_discovery_pods Discovered pods in the index.
# TYPE kvindex_discovery_pods gauge
kvindex_discovery_pods 1
# HELP kvindex_discovery_errors_total Failed lookups of the discovery source (the pods known stay as they are).
# TYPE kvindex_discovery_errors_total counter
kvindex_discovery_errors_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvindex_discovery_pods", "kvindex_discovery_errors_total"); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, reg, "join", "appeared"); got != 1 {
		t.Fatalf("join/appeared = %v", got)
	}
}

// counterValue gathers one series of kvindex_discovery_changes_total.
func counterValue(t *testing.T, reg *prometheus.Registry, change, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvindex_discovery_changes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["change"] == change && l["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series change=%s reason=%s", change, reason)
	return 0
}

func TestReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for r := range numReasons {
		s := r.String()
		if s == "" || strings.Contains(s, "(") || seen[s] {
			t.Fatalf("reason %d named %q", r, s)
		}
		seen[s] = true
	}
	if Reason(99).String() != "reason(99)" || Change(7).String() != "change(7)" {
		t.Fatal("out-of-range names")
	}
}

// syncFleet is a fakeFleet safe for the informer's goroutine and the test.
type syncFleet struct {
	mu sync.Mutex
	f  *fakeFleet
}

func (s *syncFleet) AddPod(p config.Pod) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f.AddPod(p)
}

func (s *syncFleet) RemovePod(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f.RemovePod(name)
}

func (s *syncFleet) pods() map[string]config.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]config.Pod{}
	for k, v := range s.f.pods {
		out[k] = v
	}
	return out
}
