package tokenize

import (
	"encoding/json"
	"testing"
	"unsafe"
)

// FuzzUnquote: unquote and SharedString agree with json.Unmarshal on
// every literal they accept, and SharedString's text shares the input.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`"plain"`, `"tab\there\nand \"quotes\" \\ \/"`, `"caf\u00e9"`, `"bad` + "\x01" + `"`, `"\ud83d\ude00"`, `"` + "\xff" + `"`, `"a"b"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, q []byte) {
		if shared, ok := SharedString(q); ok {
			var want string
			if err := json.Unmarshal(q, &want); err != nil || shared != want {
				t.Fatalf("SharedString(%q) = %q, json.Unmarshal: %q, %v", q, shared, want, err)
			}
			if len(shared) > 0 && unsafe.StringData(shared) != &q[1] {
				t.Fatalf("SharedString(%q) copied", q)
			}
		}
		got, ok := unquote(q)
		if !ok {
			return
		}
		var want string
		if err := json.Unmarshal(q, &want); err != nil || got != want {
			t.Fatalf("unquote(%q) = %q, json.Unmarshal: %q, %v", q, got, want, err)
		}
	})
}

// TestTextForms: a string content and a content list give their text.
func TestTextForms(t *testing.T) {
	for raw, want := range map[string]string{
		`"a\nb"`: "a\nb",
		`[{"type":"text","text":"one"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"two"}]`: "one\ntwo",
		`null`: "",
	} {
		m := WireMessage{Role: "user", Content: json.RawMessage(raw)}
		if got, err := m.Text(); err != nil || got != want {
			t.Errorf("Text(%s) = %q, %v; want %q", raw, got, err, want)
		}
	}
}
