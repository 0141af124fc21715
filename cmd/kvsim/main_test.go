package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestRunPrintsTheTable(t *testing.T) {
	out, err := run(t, "run", "--workload", "prefixes", "--requests", "60", "--engines", "2", "--routers", "round-robin,precise+load",
		"--cache-blocks", "2000", "--wire", "array", "--step-overhead", "5ms", "--prefill-rate", "20000")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"virtual time", "prefixes: 60 requests", "round-robin", "precise+load", "2 engines x 2000 blocks"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"run", "--routers", "nope"},
		{"run", "--wire", "json"},
		{"run", "--sweep-cache", "x"},
		{"run", "--workload", "/no/such/trace.jsonl"},
		{"run", "--precise-load-mode", "magic", "--workload", "prefixes", "--requests", "5"},
	} {
		if _, err := run(t, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestPrintConfig(t *testing.T) {
	out, err := run(t, "live", "--workload", "prefixes", "--requests", "5", "--print-config", "--base-port", "7000", "--engines", "2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "tcp://127.0.0.1:7000") || !strings.Contains(out, "precise+load-vllm-1") {
		t.Errorf("config:\n%s", out)
	}
}

func TestZipfZeroIsUniform(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		zipf    float64
		uniform bool
	}{
		{nil, 1.1, false},
		{[]string{"--zipf", "0"}, 0, true},
		{[]string{"--zipf", "0.8"}, 0.8, false},
	} {
		f := &flags{}
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		f.register(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		rc, err := f.config()
		if err != nil {
			t.Fatal(err)
		}
		if p := rc.Workload.Prefixes; p.ZipfS != tc.zipf || p.Uniform != tc.uniform {
			t.Errorf("%v: ZipfS %v, Uniform %v; want %v, %v", tc.args, p.ZipfS, p.Uniform, tc.zipf, tc.uniform)
		}
	}
	if _, err := run(t, "run", "--workload", "prefixes", "--zipf", "-1"); err == nil {
		t.Error("--zipf -1: no error")
	}
}
