package main

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kvindex/kvindex/config"
)

func TestServeConfig(t *testing.T) {
	cfg, err := serveConfig("", flagOverrides{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, config.Default()) {
		t.Fatalf("without --config: %+v, want config.Default()", cfg)
	}

	cfg, err = serveConfig("", flagOverrides{grpcListen: "127.0.0.1:1", metricsListen: "off", logLevel: "debug", logFormat: "json"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GRPCListen != "127.0.0.1:1" || cfg.MetricsListen != config.MetricsOff || cfg.Log.Level != "debug" || cfg.Log.Format != "json" || len(cfg.Pods) != 1 {
		t.Fatalf("flags over the default: %+v", cfg)
	}

	path := filepath.Join(t.TempDir(), "kvindex.yaml")
	if err := os.WriteFile(path, []byte("pods: [{name: p, model: m, endpoint: 'tcp://127.0.0.1:7000'}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err = serveConfig(path, flagOverrides{logFormat: "json"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Pods[0].Name != "p" || cfg.Log.Format != "json" {
		t.Fatalf("--config with a flag: %+v", cfg)
	}

	if _, err := serveConfig("", flagOverrides{logLevel: "loud"}); !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("a bad flag: err = %v, want ErrInvalid", err)
	}
	if _, err := serveConfig(filepath.Join(t.TempDir(), "missing.yaml"), flagOverrides{}); err == nil {
		t.Fatal("a missing file: no error")
	}
}

// TestRenamePod: --pod-name renames the pod the agent sits beside, chosen
// by agent.pod or as the only one, so one ConfigMap serves a Deployment.
func TestRenamePod(t *testing.T) {
	one, err := config.Parse([]byte("pods: [{name: vllm, model: m, endpoint: 'tcp://127.0.0.1:5557'}]\nnats: {url: 'nats://nats:4222'}"))
	if err != nil {
		t.Fatal(err)
	}
	if err := renamePod(one, "vllm-7f9c-abcde"); err != nil {
		t.Fatal(err)
	}
	if p, err := one.ValidateAgent(); err != nil || p.Name != "vllm-7f9c-abcde" {
		t.Fatalf("renamed: %+v %v", p, err)
	}
	two, err := config.Parse([]byte("pods: [{name: a, model: m, endpoint: 'tcp://127.0.0.1:5557'}, {name: b, model: m, endpoint: 'tcp://127.0.0.1:6557'}]\nnats: {url: 'nats://nats:4222'}\nagent: {pod: b}"))
	if err != nil {
		t.Fatal(err)
	}
	if err := renamePod(two, "b-0"); err != nil {
		t.Fatal(err)
	}
	if two.Pods[0].Name != "a" || two.Pods[1].Name != "b-0" || two.Agent.Pod != "b-0" {
		t.Fatalf("pods %+v, agent.pod %q", two.Pods, two.Agent.Pod)
	}
	two.Agent.Pod = ""
	if err := renamePod(two, "x"); err == nil {
		t.Fatal("two pods and no agent.pod: no error")
	}
}
