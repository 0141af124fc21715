package sim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// Workload kinds of WorkloadSpec.Kind (any other: a Mooncake-format file).
const (
	KindMooncake = "mooncake"
	KindPrefixes = "prefixes"
	KindTenants  = "tenants"
	KindSessions = "sessions"
	KindRAG      = "rag"
	KindTools    = "tools"
)

// DefaultTrace is the Mooncake conversation trace, from the repository root.
const DefaultTrace = "../shared/traces/mooncake-conversation.jsonl"

// WorkloadSpec says which workload to build.
type WorkloadSpec struct {
	Kind  string // one of the kinds above or a Mooncake-format file's path
	Trace string // the Mooncake trace ("": $KVSIM_TRACE, else DefaultTrace)
	// Requests keeps a trace's first n requests, or is a generator's
	// count of requests, sessions or tasks (0: all, or its default).
	Requests  int
	RateScale float64       // multiplies the arrival rate (0 or 1: as is)
	Pause     time.Duration // delays every request after the first (a sparse start), after RateScale
	// The generators' configurations; Requests and Seed override theirs.
	Prefixes workload.PrefixesConfig
	Tenants  workload.TenantsConfig
	Sessions workload.SessionsConfig
	RAG      workload.RAGConfig
	Tools    workload.ToolAgentsConfig
	Seed     uint64
}

// LoadWorkload builds the workload spec describes.
func LoadWorkload(spec WorkloadSpec) (*workload.Workload, error) {
	var (
		w   *workload.Workload
		err error
	)
	switch spec.Kind {
	case KindPrefixes:
		c := spec.Prefixes
		c.Requests, c.Seed = spec.Requests, spec.Seed
		w, err = workload.Prefixes(c)
	case KindTenants:
		c := spec.Tenants
		c.Requests, c.Seed = spec.Requests, spec.Seed
		w, err = workload.Tenants(c)
	case KindSessions:
		c := spec.Sessions
		c.Sessions, c.Seed = spec.Requests, spec.Seed
		w, err = workload.Sessions(c)
	case KindRAG:
		c := spec.RAG
		c.Requests, c.Seed = spec.Requests, spec.Seed
		w, err = workload.RAG(c)
	case KindTools:
		c := spec.Tools
		c.Tasks, c.Seed = spec.Requests, spec.Seed
		w, err = workload.ToolAgents(c)
	default:
		path := spec.Kind
		if path == KindMooncake || path == "" {
			if path, err = TracePath(spec.Trace); err != nil {
				return nil, err
			}
		}
		if w, err = workload.LoadMooncake(path); err == nil {
			w = w.Head(spec.Requests)
		}
	}
	if err != nil {
		return nil, err
	}
	if spec.RateScale > 0 && spec.RateScale != 1 {
		w = w.Scale(spec.RateScale)
	}
	if spec.Pause < 0 {
		return nil, fmt.Errorf("sim: negative pause %v", spec.Pause)
	}
	if spec.Pause > 0 {
		w = w.Pause(1, spec.Pause)
		w.Name += fmt.Sprintf(" (+%v after the first request)", spec.Pause)
	}
	return w, nil
}

// TracePath resolves the Mooncake trace: explicit, $KVSIM_TRACE, or
// DefaultTrace from RepoRoot.
func TracePath(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if env := os.Getenv("KVSIM_TRACE"); env != "" {
		return env, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("sim: finding the trace (give --trace or $KVSIM_TRACE): %w", err)
	}
	p := filepath.Join(root, filepath.FromSlash(DefaultTrace))
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("sim: the Mooncake trace is not at %s (give --trace or $KVSIM_TRACE): %w", p, err)
	}
	return p, nil
}

// RepoRoot returns the nearest directory at or above the working
// directory whose go.mod declares module github.com/kvindex/kvindex.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("sim: %w", err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && kvindexModule.Match(b) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no enclosing go.mod of module github.com/kvindex/kvindex")
		}
		dir = parent
	}
}

var kvindexModule = regexp.MustCompile(`(?m)^\s*module\s+github\.com/kvindex/kvindex\s*$`)
