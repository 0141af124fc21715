package main

import (
	"bytes"
	"strings"
	"testing"
)

// Options that cannot run are refused before anything starts, naming the
// flag.
func TestRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "0s"}, "duration"},
		{[]string{"--warmup-steps", "-2"}, "warmup-steps"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"stray"}, "unknown command"},
	} {
		code := 0
		cmd := newRoot(&code)
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(tc.args)
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %q", tc.args, err, tc.want)
		}
	}
}

// The summary's command line repeats what changes the run, with the seed.
func TestCommandLine(t *testing.T) {
	code := 0
	cmd := newRoot(&code)
	if err := cmd.ParseFlags([]string{"--duration", "15s", "--warmup-steps", "0", "--keep", "--log-level", "warn"}); err != nil {
		t.Fatal(err)
	}
	if got, want := commandLine(cmd), "kvsoak --duration 15s --warmup-steps 0 --seed 1"; got != want {
		t.Fatalf("command line %q, want %q", got, want)
	}
}
