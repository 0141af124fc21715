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
	cfg, err := serveConfig(flagOverrides{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, config.Default()) {
		t.Fatalf("without --config: %+v, want config.Default()", cfg)
	}

	cfg, err = serveConfig(flagOverrides{grpcListen: "127.0.0.1:1", metricsListen: "off", logLevel: "debug", logFormat: "json"})
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
	cfg, err = serveConfig(flagOverrides{path: path, logFormat: "json"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Pods[0].Name != "p" || cfg.Log.Format != "json" {
		t.Fatalf("--config with a flag: %+v", cfg)
	}

	// kvindex agent's flags: NATS, and the pod renamed after the others.
	cfg, err = serveConfig(flagOverrides{path: path, natsURL: "nats://nats:4222", pod: "p", podName: "p-0"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.URL != "nats://nats:4222" || cfg.Agent.Pod != "p-0" || cfg.Pods[0].Name != "p-0" {
		t.Fatalf("agent flags: nats %q, agent.pod %q, pods %+v", cfg.NATS.URL, cfg.Agent.Pod, cfg.Pods)
	}

	if _, err := serveConfig(flagOverrides{logLevel: "loud"}); !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("a bad flag: err = %v, want ErrInvalid", err)
	}
	if _, err := serveConfig(flagOverrides{path: filepath.Join(t.TempDir(), "missing.yaml")}); err == nil {
		t.Fatal("a missing file: no error")
	}
}
