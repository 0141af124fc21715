package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"1048576": 1 << 20, "512MiB": 512 << 20, "2GiB": 2 << 30, "64KiB": 64 << 10, "100B": 100} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1MiB", "1.5GiB", "1XB", "GiB", "9999999999GiB"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) accepted", in)
		}
	}
}

// TestRuntimeFlags checks that the runtime flags are applied when given
// and only then, and that bad values are refused.
func TestRuntimeFlags(t *testing.T) {
	procs, gogc, limit := runtime.GOMAXPROCS(0), debug.SetGCPercent(-1), debug.SetMemoryLimit(-1)
	debug.SetGCPercent(gogc)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(procs)
		debug.SetGCPercent(gogc)
		debug.SetMemoryLimit(limit)
	})
	run := func(args ...string) error {
		cmd := newRoot()
		cmd.SetArgs(args)
		return cmd.Execute()
	}
	// An unknown client fails after the flags are applied.
	bad := []string{"--addr", "127.0.0.1:1", "--client", "http3"}
	if err := run(append(bad, "--gomaxprocs", "1", "--gogc", "250", "--memory-limit", "3GiB")...); err == nil || !strings.Contains(err.Error(), "http3") {
		t.Fatalf("got %v", err)
	}
	if runtime.GOMAXPROCS(0) != 1 || debug.SetMemoryLimit(-1) != 3<<30 {
		t.Errorf("GOMAXPROCS %d, memory limit %d; want 1 and 3 GiB", runtime.GOMAXPROCS(0), debug.SetMemoryLimit(-1))
	}
	if got := debug.SetGCPercent(gogc); got != 250 {
		t.Errorf("GOGC %d, want 250", got)
	}
	runtime.GOMAXPROCS(procs)
	if err := run(bad...); err == nil || runtime.GOMAXPROCS(0) != procs {
		t.Errorf("without the flag GOMAXPROCS is %d, want %d left alone (err %v)", runtime.GOMAXPROCS(0), procs, err)
	}
	for _, args := range [][]string{{"--gomaxprocs", "0"}, {"--memory-limit", "lots"}} {
		if err := run(append(args, bad...)...); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: %v, want an error naming the flag", args, err)
		}
	}
}
