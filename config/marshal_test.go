package config

import (
	"reflect"
	"testing"
	"time"
)

// TestMarshalRoundTrip: Parse(Marshal(c)) == c for a Config after
// SetDefaults, whether it came from Go or from YAML.
func TestMarshalRoundTrip(t *testing.T) {
	fromREADME, err := Parse(readmeYAML(t))
	if err != nil {
		t.Fatal(err)
	}
	edited := Default()
	edited.MetricsListen = MetricsOff
	edited.Events.StaleAfterDisconnect = -1
	edited.Events.StaleAfterSilence = 30 * time.Second
	edited.Score.IncludeStale = true
	edited.Pods[0].DPSize = 2
	edited.Pods[0].ReplayEndpoint = "tcp://127.0.0.1:5567"
	edited.Push = []Push{{Listen: "tcp://*:6000", Topic: "kv@", Routes: []Route{{Topic: "e7", Pod: "vllm-7", Model: "other"}}}}
	edited.SetDefaults()

	for name, c := range map[string]*Config{"Default": Default(), "README": fromREADME, "edited": edited} {
		b, err := Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: Parse(Marshal(c)): %v\n%s", name, err, b)
		}
		if !reflect.DeepEqual(back, c) {
			t.Errorf("%s: Parse(Marshal(c)) = %+v\nwant %+v\n%s", name, back, c, b)
		}
	}
}

// TestMarshalLeavesOutZeroFields: a Config built in Go without defaults
// marshals to only what was set, in the README's keys, and parses to the
// same Config with defaults.
func TestMarshalLeavesOutZeroFields(t *testing.T) {
	c := &Config{
		GRPCListen: "127.0.0.1:0",
		Models:     []Model{{Name: "m", BlockSize: 32}},
		Pods:       []Pod{{Name: "a", Model: "m", Endpoint: "tcp://127.0.0.1:7000", MetricsURL: "http://127.0.0.1:8000/metrics"}},
	}
	b, err := Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	want := `grpc_listen: 127.0.0.1:0
models:
  - name: m
    block_size: 32
pods:
  - name: a
    model: m
    endpoint: tcp://127.0.0.1:7000
    metrics_url: http://127.0.0.1:8000/metrics
`
	if string(b) != want {
		t.Fatalf("Marshal:\n%s\nwant:\n%s", b, want)
	}
	back, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDefaults()
	if !reflect.DeepEqual(back, c) {
		t.Fatalf("Parse(Marshal(c)) = %+v, want %+v", back, c)
	}
}
