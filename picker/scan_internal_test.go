package picker

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzScanBody: whatever scanBody accepts, encoding/json decodes to the
// same fields (and the texts of the messages agree).
func FuzzScanBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi \"there\"\n"}],"stream":true,"temperature":0.5}`,
		`{"model":"m","prompt":"once upon a time","max_tokens":7,"stop":null,"logit_bias":{"1":-100}}`,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}]}`,
		` { "messages" : null , "model" : "x" } `,
		`{"model":"m\u00e9"}`,
		`{"model":"m",}`,
		`[1]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := scanBody(b)
		if !ok {
			return
		}
		var want body
		if err := json.Unmarshal(b, &want); err != nil {
			return // the scanner is lenient; the engine refuses what it accepted
		}
		if got.Model != want.Model || len(got.Messages) != len(want.Messages) {
			t.Fatalf("scan %+v, json %+v", got, want)
		}
		if (len(got.Prompt) == 0) != (len(want.Prompt) == 0) {
			t.Fatalf("prompt: scan %q, json %q", got.Prompt, want.Prompt)
		}
		for i := range got.Messages {
			gt, gerr := got.Messages[i].Text()
			wt, werr := want.Messages[i].Text()
			if got.Messages[i].Role != want.Messages[i].Role || gt != wt || (gerr == nil) != (werr == nil) {
				t.Fatalf("message %d: scan %q %q, json %q %q", i, got.Messages[i].Role, gt, want.Messages[i].Role, wt)
			}
		}
		if len(got.Prompt) > 0 {
			var a, c any
			if json.Unmarshal(got.Prompt, &a) == nil && json.Unmarshal(want.Prompt, &c) == nil && !reflect.DeepEqual(a, c) {
				t.Fatalf("prompt: scan %q, json %q", got.Prompt, want.Prompt)
			}
		}
	})
}
