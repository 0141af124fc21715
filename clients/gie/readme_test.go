package gie_test

import (
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"

	"github.com/kvindex/kvindex/clients/gie"
)

// TestREADMEConfig keeps the README's EndpointPickerConfig true: the
// framework's loader reads it, and the plugin's factory accepts the
// parameters it gives.
func TestREADMEConfig(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```yaml\napiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n")
	if !ok {
		t.Fatal("README has no EndpointPickerConfig block")
	}
	block, _, _ := strings.Cut(rest, "```")
	block = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n" + block
	cfg, _, err := loader.LoadRawConfig([]byte(block), logr.Discard())
	if err != nil {
		t.Fatalf("README EndpointPickerConfig: %v", err)
	}
	var found int
	for _, spec := range cfg.Plugins {
		if spec.Type != gie.Type {
			continue
		}
		found++
		p, err := gie.DecodeParams(spec.Parameters)
		if err != nil {
			t.Fatal(err)
		}
		if p.Target == "" || p.Model == "" || p.Timeout != "100ms" {
			t.Fatalf("README parameters decoded to %+v", p)
		}
		pl, err := gie.Factory(spec.Name, spec.Parameters, fwkplugin.NewEppHandle(testContext(t), nil))
		if err != nil {
			t.Fatalf("README parameters: %v", err)
		}
		if pl.TypedName().Name != gie.Type {
			t.Fatalf("plugin named %q, want the type as its default name", pl.TypedName().Name)
		}
	}
	if found != 1 {
		t.Fatalf("README config has %d %s plugins, want 1", found, gie.Type)
	}
	var inProfile bool
	for _, prof := range cfg.SchedulingProfiles {
		for _, ref := range prof.Plugins {
			inProfile = inProfile || ref.PluginRef == gie.Type
		}
	}
	if !inProfile {
		t.Fatal("README config's profiles do not use the plugin")
	}
}
