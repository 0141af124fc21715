package main

import (
	"slices"
	"testing"
)

// TestCheckImports: downward imports and a package's own tree pass;
// upward, sideways and product-to-testbed imports are each reported.
func TestCheckImports(t *testing.T) {
	m := module + "/"
	for _, c := range []struct {
		from, to string
		bad      bool
	}{
		{"indexer", "events", false},
		{"daemon", "fleet", false},
		{"tokenize/standin", "tokenize", false},
		{"picker/envoytest", "picker", false},
		{"indexer", "indexer/internal/blockmap", false},
		{"testbed/sim", "daemon", false},
		{"events", "indexer", true},                // upward
		{"scoring", "api", true},                   // upward
		{"fleet", "picker", true},                  // sideways
		{"events/zmq", "events/natsbus", true},     // sideways
		{"tokenize/standin", "testbed/sim", true},  // product -> testbed
		{"cmd/kvindex", "testbed/enginepub", true}, // a binary -> testbed
	} {
		got := checkImports(pkg{ImportPath: m + c.from, Imports: []string{m + c.to, "fmt"}})
		if (len(got) > 0) != c.bad {
			t.Errorf("%s -> %s: problems %q, want bad=%v", c.from, c.to, got, c.bad)
		}
	}
	if got := checkImports(pkg{ImportPath: m + "nowhere"}); !slices.ContainsFunc(got, func(s string) bool { return s != "" }) {
		t.Error("a package in no layer is not reported")
	}
}
