package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// TestRuntimeFlags checks that the runtime flags are applied when given
// and only then, and that bad values are refused.
func TestRuntimeFlags(t *testing.T) {
	procs, gogc := runtime.GOMAXPROCS(0), debug.SetGCPercent(-1)
	debug.SetGCPercent(gogc)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(procs)
		debug.SetGCPercent(gogc)
	})
	run := func(args ...string) error {
		cmd := newRoot()
		cmd.SetArgs(args)
		return cmd.Execute()
	}
	// An unknown client fails after the flags are applied.
	bad := []string{"--addr", "127.0.0.1:1", "--client", "http3"}
	if err := run(append(bad, "--gomaxprocs", "1", "--gogc", "250")...); err == nil || !strings.Contains(err.Error(), "http3") {
		t.Fatalf("got %v", err)
	}
	if runtime.GOMAXPROCS(0) != 1 {
		t.Errorf("GOMAXPROCS %d, want 1", runtime.GOMAXPROCS(0))
	}
	if got := debug.SetGCPercent(gogc); got != 250 {
		t.Errorf("GOGC %d, want 250", got)
	}
	runtime.GOMAXPROCS(procs)
	if err := run(bad...); err == nil || runtime.GOMAXPROCS(0) != procs {
		t.Errorf("without the flag GOMAXPROCS is %d, want %d left alone (err %v)", runtime.GOMAXPROCS(0), procs, err)
	}
	for _, args := range [][]string{{"--gomaxprocs", "0"}} {
		if err := run(append(args, bad...)...); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: %v, want an error naming the flag", args, err)
		}
	}
}
