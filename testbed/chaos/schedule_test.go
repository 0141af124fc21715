package chaos

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

func testPlan() Plan { return DefaultPlan(Shape{Engines: 2, Replicas: 2}, 40*time.Second) }

// A seed names its schedule: the same seed and plan give the same
// schedule, and other seeds other schedules.
func TestScheduleIsTheSeeds(t *testing.T) {
	p := testPlan()
	a, b := Schedule(7, p), Schedule(7, p)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 7 drew two schedules:\n%s\n%s", FormatSchedule(a), FormatSchedule(b))
	}
	if len(a) < 10 {
		t.Fatalf("seed 7: %d faults in 40s, want at least 10:\n%s", len(a), FormatSchedule(a))
	}
	seen := map[string]uint64{FormatSchedule(a): 7}
	for seed := uint64(1); seed <= 50; seed++ {
		s := FormatSchedule(Schedule(seed, p))
		if prev, ok := seen[s]; ok && prev != seed {
			t.Fatalf("seeds %d and %d drew the same schedule", prev, seed)
		}
		seen[s] = seed
	}
	// The fleet's shape and the phase's length are part of what a seed
	// draws from.
	q := p
	q.Replicas = 3
	if reflect.DeepEqual(Schedule(7, q), a) {
		t.Fatal("a third replica left seed 7's schedule unchanged")
	}
}

// Every schedule keeps its plan's bounds: faults in time order within the
// phase, at most MaxConcurrent at once, no target held by two faults at
// once (with the settling time between), outages and latencies within
// bounds, engine restarts far apart; and across seeds every kind occurs,
// on every role it can strike.
func TestScheduleKeepsItsBounds(t *testing.T) {
	p := testPlan()
	kinds, classes := map[Kind]int{}, map[string]int{}
	for seed := uint64(1); seed <= 300; seed++ {
		fs := Schedule(seed, p)
		for i, f := range fs {
			kinds[f.Kind]++
			classes[f.Class()]++
			if i > 0 && f.At < fs[i-1].At {
				t.Fatalf("seed %d: fault %d starts before fault %d", seed, i, i-1)
			}
			if f.At < 0 || f.End() > p.Duration || f.For <= 0 || len(f.Targets) == 0 {
				t.Fatalf("seed %d: fault %v out of the phase or without target", seed, f)
			}
			if n := overlapping(fs[:i], f) + 1; n > p.MaxConcurrent {
				t.Fatalf("seed %d: %d faults at once at %v", seed, n, f.At)
			}
			for _, target := range f.Targets {
				if held(fs[:i], f, target) {
					t.Fatalf("seed %d: %s held by two faults at %v:\n%s", seed, target, f.At, FormatSchedule(fs))
				}
			}
			switch f.Kind {
			case Latency:
				if f.Latency+f.Jitter > p.MaxLatency || f.Jitter > f.Latency {
					t.Fatalf("seed %d: %v beyond %v", seed, f, p.MaxLatency)
				}
			case Bandwidth:
				if f.RateKB < 8 {
					t.Fatalf("seed %d: %v", seed, f)
				}
			case Blackhole, Partition, LinkDown, SIGKILL, SIGTERM, SIGSTOP, EngineFreeze:
				if f.For > p.MaxOutage {
					t.Fatalf("seed %d: %v longer than %v", seed, f, p.MaxOutage)
				}
			case EngineRestart:
				if f.At < p.EngineRestartGap/4 {
					t.Fatalf("seed %d: %v too early", seed, f)
				}
				for _, o := range fs[:i] {
					if o.Kind == EngineRestart && slices.Equal(o.Targets, f.Targets) && f.At-o.At < p.EngineRestartGap {
						t.Fatalf("seed %d: %s restarted at %v and %v", seed, f.Targets[0], o.At, f.At)
					}
				}
			}
		}
	}
	for _, k := range Kinds {
		if kinds[k] < 30 {
			t.Errorf("%s drawn %d times in 300 seeds", k, kinds[k])
		}
	}
	// Every process is signalled and every kind of link struck: NATS
	// restarts, agents' paths to their engines and to NATS, replicas'.
	for _, c := range []string{"sigkill nats", "sigterm nats", "sigstop nats", "sigkill agent", "sigkill replica", "sigstop agent", "sigstop replica",
		"latency agent/engine", "latency agent/nats", "latency replica/nats", "blackhole agent/engine", "blackhole replica/nats",
		"partition agent/engine", "partition replica/nats", "reset agent/nats", "bandwidth agent/engine", "link_down replica/nats"} {
		if classes[c] < 5 {
			t.Errorf("%s drawn %d times in 300 seeds", c, classes[c])
		}
	}
}

func TestPlanValidate(t *testing.T) {
	if err := testPlan().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(*Plan){
		func(p *Plan) { p.Engines = 0 },
		func(p *Plan) { p.Duration = time.Second },
		func(p *Plan) { p.MaxOutage = 0 },
		func(p *Plan) { p.MeanGap = 0 },
	} {
		p := testPlan()
		bad(&p)
		if p.Validate() == nil {
			t.Errorf("%+v validated", p)
		}
	}
}

func TestFaultString(t *testing.T) {
	f := Fault{At: 1500 * time.Millisecond, For: 2 * time.Second, Kind: Latency, Targets: []string{"agent-0/nats"}, Stream: Upstream, Latency: 100 * time.Millisecond, Jitter: 20 * time.Millisecond}
	if got, want := f.String(), "   1.50s +2.00s latency        agent-0/nats upstream 100ms±20ms"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}

// A fault's class names its kind and the roles it struck.
func TestFaultClass(t *testing.T) {
	for _, c := range []struct {
		f    Fault
		want string
	}{
		{Fault{Kind: SIGKILL, Targets: []string{NATS}}, "sigkill nats"},
		{Fault{Kind: SIGSTOP, Targets: []string{AgentName(1)}}, "sigstop agent"},
		{Fault{Kind: Latency, Targets: []string{NATSLink(ReplicaName(2))}}, "latency replica/nats"},
		{Fault{Kind: Partition, Targets: []string{PubLink(0), ReplayLink(0)}}, "partition agent/engine"},
		{Fault{Kind: Partition, Targets: []string{NATSLink(AgentName(0)), NATSLink(ReplicaName(1))}}, "partition agent/nats+replica/nats"},
		{Fault{Kind: EngineFreeze, Targets: []string{EngineName(1), PubLink(1), ReplayLink(1)}}, "engine_freeze engine"},
		{Fault{Kind: EngineRestart, Targets: []string{EngineName(0)}}, "engine_restart engine"},
	} {
		if got := c.f.Class(); got != c.want {
			t.Errorf("%v: class %q, want %q", c.f, got, c.want)
		}
	}
}
