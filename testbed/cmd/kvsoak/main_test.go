package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/testbed/chaos"
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
		{[]string{"stray"}, "unknown command"},
		{[]string{"chaos", "--seeds", "0"}, "--seeds"},
		{[]string{"chaos", "--replicas", "4"}, "--replicas"},
		{[]string{"chaos", "--duration", "1s"}, "--duration"},
		{[]string{"chaos", "stray"}, "unknown command"},
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

// The command a failing seed prints runs that seed alone, with the
// options it ran with.
func TestChaosReplayCommand(t *testing.T) {
	o := chaos.Options{Seed: 1234, Duration: 25 * time.Second, Replicas: 3}
	args := strings.Fields(chaos.CommandLine(o))
	if len(args) < 4 || strings.Join(args[:4], " ") != "go run ./testbed/cmd/kvsoak chaos" {
		t.Fatalf("replay command %q", args)
	}
	code := 0
	cmd, rest, err := newRoot(&code).Find(args[3:])
	if err != nil || cmd.Name() != "chaos" {
		t.Fatalf("%v: %v, %v", args, cmd, err)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{"seed": "1234", "seeds": "1", "duration": "25s", "replicas": "3"} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("--%s %s, want %s", flag, got, want)
		}
	}
}
