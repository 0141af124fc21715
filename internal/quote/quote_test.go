package quote

import (
	"strings"
	"testing"
)

func TestQ(t *testing.T) {
	if got := Q("llama"); got != `"llama"` {
		t.Fatalf("short: %s", got)
	}
	long := strings.Repeat("é", 1<<19) // 1 MiB
	got := Q(long)
	if len(got) > Max+32 || !strings.HasSuffix(got, "... (1048576 bytes)") {
		t.Fatalf("long: %d bytes: %.100s", len(got), got)
	}
	if !strings.HasPrefix(got, `"éé`) {
		t.Fatalf("long: cut inside a rune: %.20q", got)
	}
}
