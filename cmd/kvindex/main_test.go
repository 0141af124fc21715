package main

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kvindex/kvindex/internal/config"
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
