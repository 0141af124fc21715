package demo

import (
	"bytes"
	"strings"
	"testing"
)

// TestDemoRuns runs the whole demo (real daemon, ZMQ, gRPC); Run checks
// every answer against the scenario and fails on any difference.
func TestDemoRuns(t *testing.T) {
	var out bytes.Buffer
	if err := Run(t.Context(), &out, Options{}); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"-> route to vllm-a/0",
		"vllm-b/1  36              576             100%",
		"demo finished: every answer matched the scenario",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
