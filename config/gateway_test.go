package config

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

const gatewayYAML = `
models:
  - name: m
    tokenizer_urls: [http://10.0.0.5:8000, http://10.0.0.6:8000]
pods:
  - {name: a, model: m, endpoint: "tcp://10.0.0.5:5557", dp_size: 2}
  - {name: b, model: m, endpoint: "tcp://10.0.0.6:5557"}
gateway:
  listen: ":9002"
  endpoints:
    - {address: "10.0.0.5:8000", pod: a, all_ranks: true}
    - {address: "10.0.0.6:8000", pod: b}
    - {address: "10.0.0.7:8000"}
`

// TestGatewayParse: defaults fill the section and each endpoint's pod and
// model.
func TestGatewayParse(t *testing.T) {
	c, err := Parse([]byte(gatewayYAML))
	if err != nil {
		t.Fatal(err)
	}
	g := c.Gateway
	if g.BodyMode != BodyModeFullDuplex || g.MaxBodyBytes != DefaultGatewayMaxBodyBytes || g.Fallbacks != DefaultGatewayFallbacks || g.MaxRequests != DefaultGatewayMaxRequests {
		t.Fatalf("defaults: %+v", g)
	}
	cold := g.Endpoints[2]
	if cold.Pod != "10.0.0.7:8000" || cold.Model != "m" {
		t.Fatalf("an endpoint without a pod: %+v, want pod = address, the only model", cold)
	}
	if len(c.Models[0].TokenizerURLs) != 2 || c.Tokenize.Timeout != DefaultTokenizeTimeout {
		t.Fatalf("tokenizer: %+v %+v", c.Models[0], c.Tokenize)
	}
}

// TestGatewayValidate: each mistake is refused naming its field.
func TestGatewayValidate(t *testing.T) {
	for _, tc := range []struct {
		name, from, to, field string
	}{
		{"listen", `listen: ":9002"`, `listen: "nope"`, "gateway.listen"},
		{"address", `"10.0.0.7:8000"}`, `"http://10.0.0.7"}`, "gateway.endpoints[2].address"},
		{"twice", `"10.0.0.7:8000"}`, `"10.0.0.6:8000"}`, "gateway.endpoints[2].address"},
		{"rank", `pod: b}`, `pod: b, dp_rank: 1}`, "gateway.endpoints[1].dp_rank"},
		{"worker behind two", `pod: b}`, `pod: a, dp_rank: 1}`, "gateway.endpoints[1].pod"},
		{"body mode", `listen: ":9002"`, "listen: \":9002\"\n  body_mode: chunked", "gateway.body_mode"},
		{"tokenizer url", `http://10.0.0.6:8000]`, `10.0.0.6:8000]`, "models[0].tokenizer_urls[1]"},
		{"model", `{address: "10.0.0.7:8000"}`, `{address: "10.0.0.7:8000", model: x}`, "gateway.endpoints[2].model"},
	} {
		text := strings.Replace(gatewayYAML, tc.from, tc.to, 1)
		_, err := Parse([]byte(text))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("%s: %v, want ErrInvalid naming %s", tc.name, err, tc.field)
		}
	}
}

// TestGatewayREADMEAndRoundTrip: the README's picker configuration
// parses, and Parse(Marshal(c)) == c for it.
func TestGatewayREADMEAndRoundTrip(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "# kvindex.yaml: the picker for one pool\n")
	if !ok {
		t.Fatal("README has no picker configuration")
	}
	block, _, _ := strings.Cut(rest, "```")
	for name, text := range map[string]string{"README": block, "test": gatewayYAML} {
		c, err := Parse([]byte(text))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out, err := Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out)
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("%s: Parse(Marshal(c)) = %+v, %v\nwant %+v", name, back, err, c)
		}
	}
}

const poolYAML = `
models:
  - name: m
gateway:
  listen: ":9002"
  inference_pool: {name: vllm, namespace: inference}
`

// TestGatewayInferencePool: an inference_pool takes its defaults (v1, the
// only model, dp_size 1, a resync) and survives a round trip; it is an
// alternative to endpoints and discovered_port, each mistake refused
// naming its field.
func TestGatewayInferencePool(t *testing.T) {
	c, err := Parse([]byte(poolYAML))
	if err != nil {
		t.Fatal(err)
	}
	ip := c.Gateway.InferencePool
	if ip.APIVersion != InferencePoolV1 || ip.Model != "m" || ip.DPSize != 1 || ip.Resync != DefaultInferencePoolResync {
		t.Fatalf("defaults: %+v", ip)
	}
	out, err := Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := Parse(out); err != nil || !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	for _, tc := range []struct {
		name, from, to, field string
	}{
		{"name", `name: vllm, `, ``, "gateway.inference_pool.name"},
		{"api version", `name: vllm`, `name: vllm, api_version: v2`, "gateway.inference_pool.api_version"},
		{"model", `name: vllm`, `name: vllm, model: x`, "gateway.inference_pool.model"},
		{"dp size", `name: vllm`, `name: vllm, dp_size: -1`, "gateway.inference_pool.dp_size"},
		{"two sources", `namespace: inference}`, "namespace: inference}\n  endpoints: [{address: \"10.0.0.7:8000\"}]", "gateway.endpoints"},
		{"discovered port without discovery", `inference_pool: {name: vllm, namespace: inference}`, `discovered_port: 8000`, "gateway.discovered_port"},
		{"no source", `inference_pool: {name: vllm, namespace: inference}`, ``, "gateway.endpoints"},
		{"no listen", `listen: ":9002"`, ``, "gateway.listen"},
	} {
		_, err := Parse([]byte(strings.Replace(poolYAML, tc.from, tc.to, 1)))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("%s: %v, want ErrInvalid naming %s", tc.name, err, tc.field)
		}
	}
}
