package events

import "testing"

func TestSplitTopic(t *testing.T) {
	for _, tc := range []struct {
		topic, base, epoch string
		barrier            bool
	}{
		{"kv@p@m", "kv@p@m", "", false},
		{"kv@p@m\x00sgl-kv-epoch=3f2a", "kv@p@m", "3f2a", false},
		{"kv@p@m\x00sgl-kv-epoch=3f2a\x00sgl-kv-snapshot=b-1", "kv@p@m", "3f2a", true},
		{"\x00sgl-kv-epoch=", "", "", false},
	} {
		base, epoch, barrier := SplitTopic([]byte(tc.topic))
		if string(base) != tc.base || string(epoch) != tc.epoch || barrier != tc.barrier {
			t.Errorf("%q: got (%q, %q, %v), want (%q, %q, %v)", tc.topic, base, epoch, barrier, tc.base, tc.epoch, tc.barrier)
		}
	}
}
