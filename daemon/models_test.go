package daemon

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/config"
)

// TestUpFrontModels: a replica shard (nats.models) registers its shard's
// models and those of its own pods, nothing else of models:; without a
// shard, or with a push listener (whose engines may name any model),
// every listed model.
func TestUpFrontModels(t *testing.T) {
	models := []config.Model{{Name: "a", BlockSize: 16}, {Name: "b", BlockSize: 32}, {Name: "c", BlockSize: 64}}
	for _, tc := range []struct {
		name string
		cfg  config.Config
		want string
	}{
		{"direct", config.Config{Models: models}, "[a b c]"},
		{"every model", config.Config{Models: models, NATS: config.NATS{URL: "nats://n:4222"}}, "[a b c]"},
		{"shard", config.Config{Models: models, NATS: config.NATS{URL: "nats://n:4222", Models: []string{"b"}}}, "[b]"},
		{"shard and its pods", config.Config{Models: models, NATS: config.NATS{URL: "nats://n:4222", Models: []string{"b"}},
			Pods: []config.Pod{{Name: "p", Model: "c"}}}, "[b c]"},
		{"shard and push", config.Config{Models: models, NATS: config.NATS{URL: "nats://n:4222", Models: []string{"b"}},
			Push: []config.Push{{Listen: "tcp://*:5557"}}}, "[a b c]"},
	} {
		var names []string
		for _, m := range upFrontModels(&tc.cfg) {
			names = append(names, m.Name)
		}
		if fmt.Sprint(names) != tc.want {
			t.Errorf("%s: %v, want %s", tc.name, names, tc.want)
		}
	}
}
