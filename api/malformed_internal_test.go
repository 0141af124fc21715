package api

import (
	"testing"

	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// FuzzBadField checks badField on arbitrary encodings of the requests:
// it never panics, names no field in an encoding protobuf-go accepts, and
// names one in every encoding protobuf-go rejects for a reason it looks
// for (truncation, a bad tag or varint, invalid UTF-8) at a depth it
// reaches, here: the seeds' failures.
func FuzzBadField(f *testing.F) {
	good, err := proto.Marshal(&kvindexv1.RouteRequest{Score: &kvindexv1.ScoreRequest{Model: "m", TokenIds: []uint32{1, 300, 70000},
		Workers: []*kvindexv1.WorkerRef{{Pod: "a", DpRank: 1}}, Loads: []*kvindexv1.WorkerLoad{{Worker: &kvindexv1.WorkerRef{Pod: "a"}}}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte{0x0a, 0x03, 0x0a, 0x01, 0xff})
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, m := range []proto.Message{&kvindexv1.RouteRequest{}, &kvindexv1.ScoreRequest{}, &kvindexv1.ListWorkersRequest{}} {
			err := proto.Unmarshal(in, m)
			got := badField(in, m.ProtoReflect().Descriptor(), "", 0)
			if err == nil && got != "" {
				t.Fatalf("%T: protobuf-go accepts %x, badField names %q", m, in, got)
			}
		}
	})
}

// TestBadFieldNamesSeedFailures: the failures of FuzzBadField's seeds are
// each found, at the path of the field.
func TestBadFieldNamesSeedFailures(t *testing.T) {
	md := (&kvindexv1.RouteRequest{}).ProtoReflect().Descriptor()
	for in, want := range map[string]string{
		"\x0a\x03\x0a\x01\xff":         "score.model (invalid UTF-8)",
		"\x80":                         "(tag)",
		"\x0a\x04\x32\x02\x0a\x05":     "score.workers[0].pod",
		"\x0a\x04\x12\x02\x80\x80":     "score.token_ids",
		"\x0a\x05\x32\x00\x32\x05\x0a": "score.workers[1]",
	} {
		if got := badField([]byte(in), md, "", 0); got != want {
			t.Errorf("badField(%x) = %q, want %q", in, got, want)
		}
	}
}
