//go:build nokubernetes

package discovery

import (
	"context"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/config"
)

// TestNoKubernetesSourcesFail: in a build without Kubernetes every
// Kubernetes source fails naming the tag, and the pure functions work.
func TestNoKubernetesSourcesFail(t *testing.T) {
	named := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "-tags nokubernetes") {
			t.Errorf("%s: %v, want an error naming the tag", what, err)
		}
	}
	c, err := NewClient("")
	named("NewClient", err)
	_, err = NewKubernetes(c, &config.KubernetesDiscovery{Selector: "app=vllm"})
	named("NewKubernetes", err)
	_, err = NewInferencePool(c, &config.InferencePool{Name: "pool"}, nil)
	named("NewInferencePool", err)
	named("Kubernetes.Run", (&Kubernetes{}).Run(context.Background(), nil))
	named("InferencePool.Run", (&InferencePool{}).Run(context.Background(), nil))
	eps, excluded := PoolEndpoints([]Pod{{Name: "a", Phase: "Running", Ready: true, IP: "10.0.0.1"}, {Name: "b", Phase: "Pending"}}, []int{8000}, "m", 1)
	if len(eps) != 1 || eps[0].Address != "10.0.0.1:8000" || excluded != 1 {
		t.Errorf("PoolEndpoints: %+v, %d excluded", eps, excluded)
	}
}
