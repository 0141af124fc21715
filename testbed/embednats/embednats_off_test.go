//go:build noembednats

package embednats

import (
	"strings"
	"testing"
)

// TestNoEmbedNATSFails: a build without the embedded server fails to
// start one, naming the tag and the make target that has it.
func TestNoEmbedNATSFails(t *testing.T) {
	s, err := Start("test")
	if s != nil || err == nil || !strings.Contains(err.Error(), "-tags noembednats") || !strings.Contains(err.Error(), "make demo-fleet") {
		t.Fatalf("Start: %v, %v", s, err)
	}
}
