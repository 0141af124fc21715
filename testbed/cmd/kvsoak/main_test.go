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
