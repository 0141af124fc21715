package config

import "testing"

// FuzzParse: Parse never panics on any input, and a configuration it
// accepts survives Marshal and Parse unchanged.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"",
		"grpc_listen: \":50051\"\npods:\n  - {name: a, model: m, endpoint: \"tcp://h:1\"}\n",
		"models:\n  - {name: m, block_size: 32}\npush:\n  - listen: tcp://*:5557\n    allow: [10.0.0.0/8]\n    routes: [{topic: t, pod: p, model: m}]\n",
		"events: {gap_policy: keep, replay_timeout: 2s, queue_bytes: 1024}\nscoring: {policy: longest_prefix, guard: static}\n",
		"tls: {cert_file: c, key_file: k}\nauth: {tokens: [{name: a, scopes: [read], env: E}]}\n",
		"pods: [{name: a, model: m, endpoint: \"tcp://h:65535\", dp_size: 2}]\n",
		"limits: {max_tokens: -1}\n",
		"\tnot: [yaml\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		text, err := Marshal(c)
		if err != nil {
			t.Fatalf("accepted config does not marshal: %v", err)
		}
		again, err := Parse(text)
		if err != nil {
			t.Fatalf("marshalled config does not parse: %v\n%s", err, text)
		}
		// Compared as text: an empty list and no list are the same config.
		text2, err := Marshal(again)
		if err != nil || string(text2) != string(text) {
			t.Fatalf("round trip changed the config (%v):\n%s\n%s", err, text, text2)
		}
	})
}
