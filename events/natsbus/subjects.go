package natsbus

import (
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/events"
)

// Subjects and keys of the fleet contract (docs/fleet.md):
//
//	kvindex.v1.delta.<model>.<pod>.<dp_rank>   a worker's deltas (core NATS)
//	kvindex.v1.snap.<model>.<pod>.<dp_rank>    its snapshot requests (request/reply)
//	<model>.<pod>.<dp_rank>                    its registration in the agents' bucket
//
// <model> and <pod> are escaped (Token) to fit one subject token and key.
const (
	DeltaPrefix    = "kvindex.v1.delta"
	SnapshotPrefix = "kvindex.v1.snap"
	// DefaultBucket is the agents' key-value bucket.
	DefaultBucket = "kvindex_agents"
)

// Token escapes a name into one subject token that is a valid key: letters,
// digits, '-' and '_' stay; other bytes become "=" and two hex digits; ""
// becomes "=".
func Token(s string) string {
	if s == "" {
		return "="
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
			continue
		}
		const hex = "0123456789ABCDEF"
		b.WriteByte('=')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// Untoken reverses Token; ok is false for text Token never produces.
func Untoken(t string) (string, bool) {
	if t == "=" {
		return "", true
	}
	if !strings.Contains(t, "=") {
		return t, t != ""
	}
	var b strings.Builder
	for i := 0; i < len(t); i++ {
		if t[i] != '=' {
			b.WriteByte(t[i])
			continue
		}
		if i+2 >= len(t) {
			return "", false
		}
		v, err := strconv.ParseUint(t[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), true
}

// WorkerKey is the registration key of a worker of model.
func WorkerKey(model string, w events.WorkerRef) string {
	return Token(model) + "." + Token(w.Pod) + "." + strconv.Itoa(w.DPRank)
}

// ParseWorkerKey reads a registration key back.
func ParseWorkerKey(key string) (model string, w events.WorkerRef, ok bool) {
	parts := strings.Split(key, ".")
	if len(parts) != 3 {
		return "", w, false
	}
	m, ok1 := Untoken(parts[0])
	p, ok2 := Untoken(parts[1])
	r, err := strconv.Atoi(parts[2])
	if !ok1 || !ok2 || err != nil || r < 0 || strconv.Itoa(r) != parts[2] {
		return "", w, false
	}
	return m, events.WorkerRef{Pod: p, DPRank: r}, true
}

// DeltaSubject is where a worker's deltas are published.
func DeltaSubject(model string, w events.WorkerRef) string {
	return DeltaPrefix + "." + WorkerKey(model, w)
}

// SnapshotSubject is where a worker's snapshots are asked for.
func SnapshotSubject(model string, w events.WorkerRef) string {
	return SnapshotPrefix + "." + WorkerKey(model, w)
}
