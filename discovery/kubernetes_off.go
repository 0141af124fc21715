//go:build nokubernetes

package discovery

import (
	"context"
	"errors"
	"log/slog"

	"github.com/kvindex/kvindex/config"
)

// errNoKubernetes is what every Kubernetes source returns in a build
// without them: such a daemon refuses discovery.kubernetes and
// gateway.inference_pool when it starts, naming the tag.
var errNoKubernetes = errors.New("discovery: this kvindex is built with -tags nokubernetes, without Kubernetes discovery or InferencePools; build it without the tag")

// Client stands for the Kubernetes client in a build without one.
type Client struct{}

// NewClient fails: the build has no Kubernetes client.
func NewClient(string) (Client, error) { return Client{}, errNoKubernetes }

// Kubernetes is the pod watcher a build without Kubernetes lacks.
type Kubernetes struct{}

// NewKubernetes fails: the build has no Kubernetes client.
func NewKubernetes(Client, *config.KubernetesDiscovery) (*Kubernetes, error) {
	return nil, errNoKubernetes
}

// Run fails: the build has no Kubernetes client.
func (*Kubernetes) Run(context.Context, *Reconciler) error { return errNoKubernetes }

// InferencePool is the pool watcher a build without Kubernetes lacks.
type InferencePool struct{}

// NewInferencePool fails: the build has no Kubernetes client.
func NewInferencePool(Client, *config.InferencePool, *slog.Logger) (*InferencePool, error) {
	return nil, errNoKubernetes
}

// Run fails: the build has no Kubernetes client.
func (*InferencePool) Run(context.Context, func([]Endpoint)) error { return errNoKubernetes }

// Errors is 0: nothing is watched.
func (*InferencePool) Errors() int64 { return 0 }

// Excluded is 0: nothing is watched.
func (*InferencePool) Excluded() int64 { return 0 }
