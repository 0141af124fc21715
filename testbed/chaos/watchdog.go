package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"time"
)

// Goroutine is one goroutine of a Go stack dump (SIGQUIT's, or
// runtime/pprof's goroutine profile at debug=2).
type Goroutine struct {
	ID     string
	State  string   // "semacquire", "sync.Mutex.Lock", "chan receive", ...
	Wait   string   // "2 minutes", when the runtime says
	Frames []string // function names, innermost first
	Places []string // file:line of each frame
}

var goroutineHeader = regexp.MustCompile(`^goroutine (\d+) (?:gp=\S+ m=\S+ (?:mp=\S+ )?)?\[([^,\]]+)(?:, ([^\]]+))?\]:$`)

// ParseGoroutines reads the goroutines of a stack dump; other lines (a
// log before the dump, register dumps) are skipped.
func ParseGoroutines(dump string) []Goroutine {
	var out []Goroutine
	var g *Goroutine
	for _, line := range strings.Split(dump, "\n") {
		if m := goroutineHeader.FindStringSubmatch(line); m != nil {
			out = append(out, Goroutine{ID: m[1], State: m[2], Wait: m[3]})
			g = &out[len(out)-1]
			continue
		}
		switch {
		case g == nil:
		case line == "":
			g = nil
		case strings.HasPrefix(line, "\t"):
			place, _, _ := strings.Cut(strings.TrimSpace(line), " ")
			if len(g.Places) < len(g.Frames) {
				g.Places = append(g.Places, place)
			}
		case strings.HasPrefix(line, "created by "):
			g = nil
		default:
			fn := line
			if i := strings.LastIndexByte(fn, '('); i > 0 {
				fn = fn[:i]
			}
			g.Frames = append(g.Frames, fn)
		}
	}
	return out
}

// blockedStates are the states of a goroutine that waits on a lock or on
// a peer that may never come: where a deadlock shows.
var blockedStates = map[string]bool{"semacquire": true, "sync.Mutex.Lock": true, "sync.RWMutex.Lock": true,
	"sync.RWMutex.RLock": true, "sync.Cond.Wait": true, "chan send": true, "chan send (nil chan)": true, "chan receive (nil chan)": true}

// Stuck names the goroutines of a dump that look stuck: blocked on a lock
// or a send (blockedStates) inside a function of module (a path prefix
// such as "github.com/kvindex/kvindex/"), longest waits first; each as
// "goroutine N [state, wait] in fn (place), called from fn (place)".
func Stuck(gs []Goroutine, module string) []string {
	type hit struct {
		g   Goroutine
		at  int
		key string
	}
	var hits []hit
	for _, g := range gs {
		if !blockedStates[g.State] {
			continue
		}
		for i, f := range g.Frames {
			if strings.HasPrefix(f, module) {
				hits = append(hits, hit{g, i, waitKey(g.Wait)})
				break
			}
		}
	}
	sort.SliceStable(hits, func(i, j int) bool { return hits[i].key > hits[j].key })
	var out []string
	for _, h := range hits {
		var b strings.Builder
		fmt.Fprintf(&b, "goroutine %s [%s", h.g.ID, h.g.State)
		if h.g.Wait != "" {
			b.WriteString(", " + h.g.Wait)
		}
		fmt.Fprintf(&b, "] in %s (%s)", h.g.Frames[h.at], place(h.g, h.at))
		for k := h.at + 1; k < len(h.g.Frames); k++ {
			if strings.HasPrefix(h.g.Frames[k], module) {
				fmt.Fprintf(&b, ", called from %s (%s)", h.g.Frames[k], place(h.g, k))
				break
			}
		}
		out = append(out, b.String())
	}
	return out
}

func place(g Goroutine, i int) string {
	if i < len(g.Places) {
		return filepath.Base(g.Places[i])
	}
	return "?"
}

// waitKey orders waits: minutes (the runtime prints them from one minute
// on) before no wait, more before fewer.
func waitKey(w string) string {
	var n int
	if _, err := fmt.Sscanf(w, "%d minutes", &n); err == nil {
		return fmt.Sprintf("%09d", n)
	}
	return ""
}

// heartbeats tracks the harness's own loops: each beats as it goes, and a
// loop that has not beaten for longer than its allowance is stuck.
type heartbeats struct {
	mu    sync.Mutex
	last  map[string]time.Time
	allow map[string]time.Duration
}

// beat records that loop name made progress at now.
func (h *heartbeats) beat(name string, allow time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		h.last, h.allow = map[string]time.Time{}, map[string]time.Duration{}
	}
	h.last[name], h.allow[name] = time.Now(), allow
}

// done forgets loop name (it ended).
func (h *heartbeats) done(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.last, name)
}

// late returns the loops that are late at now.
func (h *heartbeats) late(now time.Time) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for n, t := range h.last {
		if now.Sub(t) > h.allow[n] {
			out = append(out, fmt.Sprintf("%s (last progress %v ago)", n, now.Sub(t).Round(time.Millisecond)))
		}
	}
	sort.Strings(out)
	return out
}

// selfDump writes this process's goroutines (debug=2) to dir and returns
// the path and the stuck ones.
func selfDump(dir string) (string, []string) {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	path := filepath.Join(dir, fmt.Sprintf("harness-goroutines-%d.txt", time.Now().UnixNano()))
	_ = os.WriteFile(path, b.Bytes(), 0o644)
	return path, Stuck(ParseGoroutines(b.String()), "github.com/kvindex/kvindex/")
}

// watchProcesses probes every live process of the fleet every two
// seconds; one that fails two probes in a row (ten seconds each) is sent
// SIGQUIT, its dump read and the stuck goroutines named in a violation,
// and it is started again. It also watches the harness's own loops.
func (r *run) watchProcesses(ctx context.Context) {
	fails := map[*child]int{}
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if late := r.beats.late(time.Now()); len(late) > 0 {
			path, stuck := selfDump(r.dir)
			r.violate("d", "harness_stuck", "harness loops stuck: %s; stuck goroutines: %s; dump %s", strings.Join(late, ", "), strings.Join(first(stuck, 3), "; "), path)
		}
		for _, c := range r.children() {
			live, instance, _, since := c.state()
			if !live || time.Since(since) < 5*time.Second {
				delete(fails, c)
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := c.ready(pctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if live2, instance2, _, _ := c.state(); err == nil || !live2 || instance2 != instance {
				delete(fails, c)
				continue
			}
			if fails[c]++; fails[c] < 2 {
				continue
			}
			delete(fails, c)
			r.deadlocked(ctx, c, err)
		}
	}
}

// deadlocked dumps a process that stopped answering, names its stuck
// goroutines in a violation and starts it again.
func (r *run) deadlocked(ctx context.Context, c *child, probe error) {
	dump, n, err := c.quit()
	if err != nil {
		r.violate("d", "unresponsive", "%s (instance %d) did not answer for 20 s (%v) and could not be dumped: %v", c.name, n, probe, err)
	} else {
		stuck := Stuck(ParseGoroutines(dump), "github.com/kvindex/kvindex/")
		if c.name == NATS {
			stuck = Stuck(ParseGoroutines(dump), "github.com/nats-io/nats-server/")
		}
		r.violate("d", "deadlock", "%s (instance %d) did not answer for 20 s (%v); %d goroutines look stuck: %s (dump in %s)",
			c.name, n, probe, len(stuck), strings.Join(first(stuck, 3), "; "), c.logPath(n))
	}
	if ctx.Err() == nil {
		if err := c.start(); err != nil {
			r.harnessError("restart %s after its dump: %v", c.name, err)
		}
	}
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }
