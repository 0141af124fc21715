//go:build nokubernetes

package config

import (
	"errors"
	"strings"
	"testing"
)

// TestNoKubernetesRefusesDiscovery: a build without Kubernetes refuses a
// discovery.kubernetes section when the configuration loads, naming the
// field and the tag; DNS discovery is unchanged.
func TestNoKubernetesRefusesDiscovery(t *testing.T) {
	_, err := Parse([]byte("discovery: {kubernetes: {selector: 'app=vllm', model: llama}}"))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "discovery.kubernetes.selector") || !strings.Contains(err.Error(), "-tags nokubernetes") {
		t.Fatalf("kubernetes discovery in a nokubernetes build: %v", err)
	}
	if _, err := Parse([]byte("discovery: {dns: {name: vllm.ns.svc, model: m}}")); err != nil {
		t.Fatalf("dns discovery: %v", err)
	}
}
