package chaos

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kind is what a fault does.
type Kind string

// The faults a schedule draws. Link faults act on one proxied TCP path
// (Net); process faults signal a child process; engine faults act on a
// simulated engine of the harness.
const (
	Latency   Kind = "latency"   // delay (and jitter) on one direction of a link
	Bandwidth Kind = "bandwidth" // a rate cap on one direction of a link
	Reset     Kind = "reset"     // TCP RST on a link's connections
	Blackhole Kind = "blackhole" // one direction of a link holds its bytes
	Partition Kind = "partition" // both directions of several links hold
	LinkDown  Kind = "link_down" // a link closes its connections and refuses new ones
	SIGKILL   Kind = "sigkill"   // kill a process, start it again after the fault
	SIGTERM   Kind = "sigterm"   // stop a process cleanly, start it again after the fault
	SIGSTOP   Kind = "sigstop"   // pause a process (SIGSTOP), resume it (SIGCONT) after the fault
	// EngineRestart ends an engine process and starts a new one on the
	// same ports after the fault: an empty cache, seq from 0.
	EngineRestart Kind = "engine_restart"
	// EngineFreeze stops an engine as SIGSTOP would: no steps, its links
	// holding both ways (a stopped process's sockets take no bytes).
	EngineFreeze Kind = "engine_freeze"
)

// Kinds lists every kind, in the order reports use.
var Kinds = []Kind{Latency, Bandwidth, Reset, Blackhole, Partition, LinkDown, SIGKILL, SIGTERM, SIGSTOP, EngineRestart, EngineFreeze}

// Fault is one scheduled fault: from At (since the fault phase began) for
// For, Kind on Targets (link or process names, see Shape). Stream is the
// direction of a one-way link fault; Latency and Jitter, RateKB (KB/s)
// its parameters.
type Fault struct {
	At, For         time.Duration
	Kind            Kind
	Targets         []string
	Stream          string        `json:",omitempty"`
	Latency, Jitter time.Duration `json:",omitempty"`
	RateKB          int64         `json:",omitempty"`
}

// End is when the fault is healed.
func (f Fault) End() time.Duration { return f.At + f.For }

// String is the fault on one line, as failure reports print it.
func (f Fault) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%7.2fs +%.2fs %-14s %s", f.At.Seconds(), f.For.Seconds(), f.Kind, strings.Join(f.Targets, ","))
	if f.Stream != "" {
		b.WriteString(" " + f.Stream)
	}
	switch f.Kind {
	case Latency:
		fmt.Fprintf(&b, " %v±%v", f.Latency, f.Jitter)
	case Bandwidth:
		fmt.Fprintf(&b, " %d KB/s", f.RateKB)
	}
	return b.String()
}

// Class is the fault's kind and what it struck, by role: "sigkill nats",
// "latency agent/nats", "partition agent/nats+replica/nats",
// "engine_restart engine" (an engine's links are "agent/engine"); reports
// count faults by class.
func (f Fault) Class() string {
	targets := f.Targets
	if f.Kind == EngineFreeze {
		targets = targets[:1] // the engine; its links hold with it
	}
	var roles []string
	for _, t := range targets {
		who, path, _ := strings.Cut(t, "/")
		role, _, _ := strings.Cut(who, "-")
		if role == "engine" && path != "" {
			role = "agent" // an engine's link is its agent's path to it
			path = "engine"
		}
		if path != "" {
			role += "/" + path
		}
		if !slices.Contains(roles, role) {
			roles = append(roles, role)
		}
	}
	slices.Sort(roles)
	return string(f.Kind) + " " + strings.Join(roles, "+")
}

// Shape names the fleet's parts the schedule draws targets from: engine i
// with its agent i (one pod each), replica j, and nats. Links are
// "engine-i/pub" and "engine-i/replay" (agent i to its engine),
// "agent-i/nats" and "replica-j/nats".
type Shape struct{ Engines, Replicas int }

// EngineName, AgentName and ReplicaName name fleet parts.
func EngineName(i int) string  { return fmt.Sprintf("engine-%d", i) }
func AgentName(i int) string   { return fmt.Sprintf("agent-%d", i) }
func ReplicaName(j int) string { return fmt.Sprintf("replica-%d", j) }

// NATS is the nats-server's name as a target.
const NATS = "nats"

// PubLink, ReplayLink and NATSLink name links: an engine's event and
// replay paths from its agent, and a process's path to NATS.
func PubLink(i int) string        { return EngineName(i) + "/pub" }
func ReplayLink(i int) string     { return EngineName(i) + "/replay" }
func NATSLink(proc string) string { return proc + "/nats" }

// Links returns every link of the shape.
func (s Shape) Links() []string {
	var out []string
	for i := range s.Engines {
		out = append(out, PubLink(i), ReplayLink(i), NATSLink(AgentName(i)))
	}
	for j := range s.Replicas {
		out = append(out, NATSLink(ReplicaName(j)))
	}
	return out
}

// Processes returns the processes a signal may target: agents, replicas
// and nats.
func (s Shape) Processes() []string {
	var out []string
	for i := range s.Engines {
		out = append(out, AgentName(i))
	}
	for j := range s.Replicas {
		out = append(out, ReplicaName(j))
	}
	return append(out, NATS)
}

// Plan bounds a schedule. Its bounds keep every fault within what the
// fleet is configured to survive exactly, so that a failure is a bug, not
// a limit: outages shorter than an engine's replay buffer spans, engine
// restarts far enough apart that a restarted engine's seq cannot pass
// its predecessor's while an agent is away (docs/fleet.md, "Limit").
type Plan struct {
	Shape
	Duration      time.Duration // the fault phase; every fault ends within it
	MeanGap       time.Duration // mean time between fault starts (exponential)
	MaxConcurrent int           // faults in effect at once
	MaxOutage     time.Duration // longest hold, partition, pause or downtime
	MaxLatency    time.Duration // largest latency plus jitter on a link
	// EngineRestartGap is the least time between two restarts of one
	// engine, and before its first.
	EngineRestartGap time.Duration
}

// DefaultPlan is the fault phase kvsoak chaos runs for d over shape.
func DefaultPlan(shape Shape, d time.Duration) Plan {
	return Plan{Shape: shape, Duration: d, MeanGap: 1200 * time.Millisecond, MaxConcurrent: 3,
		MaxOutage: 4 * time.Second, MaxLatency: 250 * time.Millisecond, EngineRestartGap: 20 * time.Second}
}

// Validate reports the first bound that cannot make a schedule.
func (p Plan) Validate() error {
	switch {
	case p.Engines < 1 || p.Replicas < 1:
		return fmt.Errorf("chaos: plan: %d engines and %d replicas, want at least one of each", p.Engines, p.Replicas)
	case p.Duration < 2*time.Second:
		return fmt.Errorf("chaos: plan: fault phase %v, want at least 2s", p.Duration)
	case p.MeanGap <= 0 || p.MaxConcurrent < 1 || p.MaxOutage < time.Second || p.MaxLatency < 20*time.Millisecond:
		return fmt.Errorf("chaos: plan: mean gap %v, max concurrent %d, max outage %v, max latency %v: all must be positive (outage at least 1s, latency 20ms)",
			p.MeanGap, p.MaxConcurrent, p.MaxOutage, p.MaxLatency)
	}
	return nil
}

// weights are the kinds' relative frequencies.
var weights = map[Kind]int{Latency: 3, Bandwidth: 2, Reset: 2, Blackhole: 3, Partition: 2, LinkDown: 1,
	SIGKILL: 3, SIGTERM: 1, SIGSTOP: 2, EngineRestart: 2, EngineFreeze: 1}

// Schedule draws the fault phase's schedule from seed: a pure function of
// (seed, p), so a seed names its schedule. Faults start at exponential
// gaps (mean MeanGap); each takes a kind by weight and targets that no
// other fault overlapping it holds, and is left out when MaxConcurrent
// faults would overlap it or no target is free.
func Schedule(seed uint64, p Plan) []Fault {
	rng := rand.New(rand.NewPCG(seed, 0x6368616f73)) // "chaos"
	var out []Fault
	total := 0
	for _, k := range Kinds {
		total += weights[k]
	}
	for t := 500 * time.Millisecond; ; {
		t += time.Duration(rng.ExpFloat64() * float64(p.MeanGap))
		if t > p.Duration-time.Second {
			break
		}
		pick := rng.IntN(total)
		var kind Kind
		for _, k := range Kinds {
			if pick -= weights[k]; pick < 0 {
				kind = k
				break
			}
		}
		f, ok := draw(rng, p, kind, t, out)
		if !ok {
			continue
		}
		f.For = min(f.For, p.Duration-f.At)
		if overlapping(out, f) >= p.MaxConcurrent {
			continue
		}
		out = append(out, f)
	}
	return out
}

// draw makes a fault of kind at t, with targets free of every fault in
// out that it would overlap.
func draw(rng *rand.Rand, p Plan, kind Kind, t time.Duration, out []Fault) (Fault, bool) {
	f := Fault{At: t, Kind: kind, For: between(rng, 500*time.Millisecond, p.MaxOutage)}
	free := func(names []string) []string {
		return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return held(out, f, n) })
	}
	one := func(names []string) bool {
		c := free(names)
		if len(c) == 0 {
			return false
		}
		f.Targets = []string{c[rng.IntN(len(c))]}
		return true
	}
	stream := func() {
		f.Stream = []string{Upstream, Downstream}[rng.IntN(2)]
	}
	switch kind {
	case Latency:
		f.For = between(rng, time.Second, 3*p.MaxOutage)
		f.Latency = between(rng, 10*time.Millisecond, p.MaxLatency*3/4)
		f.Jitter = between(rng, 0, min(f.Latency, p.MaxLatency-f.Latency))
		stream()
		return f, one(p.Links())
	case Bandwidth:
		f.For = between(rng, time.Second, 3*p.MaxOutage)
		f.RateKB = int64(8 << rng.IntN(5)) // 8 to 128 KB/s
		stream()
		return f, one(p.Links())
	case Reset:
		f.For = 300 * time.Millisecond
		return f, one(p.Links())
	case Blackhole:
		stream()
		return f, one(p.Links())
	case LinkDown:
		return f, one(p.Links())
	case Partition:
		// Cut one or two processes off from NATS, or an agent off from
		// its engine.
		if rng.IntN(3) == 0 {
			i := rng.IntN(p.Engines)
			f.Targets = free([]string{PubLink(i), ReplayLink(i)})
			return f, len(f.Targets) == 2
		}
		c := free(slices.Collect(func(yield func(string) bool) {
			for _, proc := range p.Processes() {
				if proc != NATS && !yield(NATSLink(proc)) {
					return
				}
			}
		}))
		rng.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
		f.Targets = c[:min(len(c), 1+rng.IntN(2))]
		slices.Sort(f.Targets)
		return f, len(f.Targets) > 0
	case SIGKILL, SIGTERM, SIGSTOP:
		return f, one(p.Processes())
	case EngineRestart:
		f.For = between(rng, 100*time.Millisecond, 2*time.Second)
		var c []string
		for i := range p.Engines {
			if restartable(out, i, t, p.EngineRestartGap) {
				c = append(c, EngineName(i))
			}
		}
		return f, one(c)
	case EngineFreeze:
		i := rng.IntN(p.Engines)
		f.Targets = free([]string{EngineName(i), PubLink(i), ReplayLink(i)})
		return f, len(f.Targets) == 3
	}
	return f, false
}

// between draws a duration in [lo, hi], to the millisecond.
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return (lo + time.Duration(rng.Int64N(int64(hi-lo)+1))).Round(time.Millisecond)
}

// settle is the quiet time a target gets between two faults: a restarted
// process starts, a healed link reconnects.
const settle = 500 * time.Millisecond

// held reports whether a fault of out that overlaps f (with settle on
// either side) holds target.
func held(out []Fault, f Fault, target string) bool {
	for _, o := range out {
		if o.At < f.End()+settle && f.At < o.End()+settle && slices.Contains(o.Targets, target) {
			return true
		}
	}
	return false
}

// overlapping counts the faults of out in effect during f.
func overlapping(out []Fault, f Fault) int {
	n := 0
	for _, o := range out {
		if o.At < f.End() && f.At < o.End() {
			n++
		}
	}
	return n
}

// restartable reports whether engine i may restart at t: gap after its
// last restart, and after the phase began.
func restartable(out []Fault, i int, t, gap time.Duration) bool {
	last := time.Duration(math.MinInt64 / 2)
	if t < gap/4 {
		return false
	}
	for _, o := range out {
		if o.Kind == EngineRestart && o.Targets[0] == EngineName(i) {
			last = o.At
		}
	}
	return t-last >= gap
}

// FormatSchedule prints a schedule, one fault a line.
func FormatSchedule(fs []Fault) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	return b.String()
}
