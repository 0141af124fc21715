package natsbus

import (
	"testing"

	"github.com/kvindex/kvindex/events"
)

func TestTokenRoundTrip(t *testing.T) {
	for _, s := range []string{"", "default", "meta-llama/Llama-3.1-8B-Instruct", "10.0.0.5:8000", "a.b*c>d e=f", "ünï", "x=41"} {
		tok := Token(s)
		for i := 0; i < len(tok); i++ {
			c := tok[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '=') {
				t.Fatalf("Token(%q) = %q has %q", s, tok, c)
			}
		}
		back, ok := Untoken(tok)
		if !ok || back != s {
			t.Fatalf("Untoken(Token(%q)) = %q, %v", s, back, ok)
		}
	}
	for _, bad := range []string{"=4", "=zz", "a=1"} {
		if _, ok := Untoken(bad); ok {
			t.Errorf("Untoken(%q) accepted", bad)
		}
	}
}

func TestWorkerKeys(t *testing.T) {
	w := events.WorkerRef{Pod: "vllm-0.ns", DPRank: 3}
	k := WorkerKey("org/model.v2", w)
	if k != "org=2Fmodel=2Ev2.vllm-0=2Ens.3" {
		t.Fatalf("key %q", k)
	}
	m, got, ok := ParseWorkerKey(k)
	if !ok || m != "org/model.v2" || got != w {
		t.Fatalf("parse: %q %v %v", m, got, ok)
	}
	if DeltaSubject("m", w) != "kvindex.v1.delta.m.vllm-0=2Ens.3" || SnapshotSubject("m", w) != "kvindex.v1.snap.m.vllm-0=2Ens.3" {
		t.Fatal("subjects")
	}
	for _, bad := range []string{"m.p", "m.p.-1", "m.p.01", "m.p.x", "m..1"} {
		if _, _, ok := ParseWorkerKey(bad); ok {
			t.Errorf("ParseWorkerKey(%q) accepted", bad)
		}
	}
}
