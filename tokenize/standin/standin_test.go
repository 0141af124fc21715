package standin_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/tokenize"
	"github.com/kvindex/kvindex/tokenize/standin"
)

// TestChatTurnExtendsPrevious: the next turn of a conversation starts
// with every id of the previous one, generation prompt included, which is
// what lets a multi-turn conversation find its history cached.
func TestChatTurnExtendsPrevious(t *testing.T) {
	turn1 := []tokenize.Message{{Role: "system", Content: "you are terse"}, {Role: "user", Content: "what is a KV cache?"}}
	turn2 := append(slices.Clone(turn1), tokenize.Message{Role: "assistant", Content: "attention state, kept"}, tokenize.Message{Role: "user", Content: "and prefix caching?"})
	a, b := standin.Chat(turn1, true), standin.Chat(turn2, true)
	if len(b) <= len(a) || !slices.Equal(b[:len(a)], a) {
		t.Fatalf("turn 2 %v does not extend turn 1 %v", b, a)
	}
	// BOS, then header and content per message: 1 + (1+4) + (1+5) + 1.
	if len(a) != 13 || a[0] != standin.BOS() || a[1] != standin.Header("system") || a[len(a)-1] != standin.Header("assistant") {
		t.Fatalf("turn 1 %v: want 13 ids, BOS, the system header first, the assistant header last", a)
	}
	if c := standin.Chat(turn1, false); !slices.Equal(c, a[:len(a)-1]) {
		t.Fatal("without the generation prompt, the last header is not the only difference")
	}
}

// TestPieces: a completion's paragraphs are its segments, one token per
// four bytes; equal paragraphs give equal ids whatever follows; the ids
// are the segments' tokens, as a simulated engine's KV events
// carry them.
func TestPieces(t *testing.T) {
	segs := standin.Pieces("alpha beta\n\ngamma", true)
	if len(segs) != 3 || segs[1].Len != 3 || segs[2].Len != 2 || segs[0].Len != 1 {
		t.Fatalf("segments %+v: want BOS, 3 tokens, 2 tokens", segs)
	}
	toks := standin.Tokens("alpha beta\n\ngamma", true)
	if len(toks) != 6 || toks[0] != standin.BOS() || toks[1] != standin.Token(segs[1].ID, 0) || toks[5] != standin.Token(segs[2].ID, 1) {
		t.Fatalf("tokens %v", toks)
	}
	if other := standin.Tokens("alpha beta\n\ndelta epsilon", true); !slices.Equal(other[:4], toks[:4]) || slices.Equal(other[4:6], toks[4:6]) {
		t.Fatal("paragraphs are not independent runs")
	}
	if no := standin.Tokens("alpha beta", false); len(no) != 3 || no[0] == standin.BOS() {
		t.Fatalf("without special tokens: %v", no)
	}
}

// TestHandlerWire: /tokenize and the render endpoints answer the same
// ids in vLLM's shapes; an unknown model is vLLM's 404 error object; with
// NoRender the render endpoints are a bare 404.
func TestHandlerWire(t *testing.T) {
	h := &standin.Handler{Models: []string{"m"}}
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(path, body string) (int, []byte) {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.Bytes()
	}
	chat := `{"model":"m","messages":[{"role":"user","content":"hi there"}]}`
	want := standin.Chat([]tokenize.Message{{Role: "user", Content: "hi there"}}, true)
	code, b := post("/tokenize", chat)
	var tr tokenize.WireResponse
	if code != 200 || json.Unmarshal(b, &tr) != nil || !slices.Equal(tr.Tokens, want) || tr.Count != len(want) || tr.MaxModelLen != 131072 {
		t.Fatalf("/tokenize: %d %s", code, b)
	}
	code, b = post(tokenize.RenderChatPath, chat)
	var rr tokenize.WireRender
	if code != 200 || json.Unmarshal(b, &rr) != nil || !slices.Equal(rr.TokenIDs, want) || rr.RequestID == "" || rr.Model != "m" {
		t.Fatalf("chat render: %d %s", code, b)
	}
	code, b = post(tokenize.RenderCompletionPath, `{"model":"m","prompt":"alpha beta"}`)
	var list []tokenize.WireRender
	if code != 200 || json.Unmarshal(b, &list) != nil || len(list) != 1 || !slices.Equal(list[0].TokenIDs, standin.Tokens("alpha beta", true)) {
		t.Fatalf("completion render: %d %s", code, b)
	}
	if code, b = post(tokenize.RenderChatPath, `{"model":"x","messages":[]}`); code != 404 || !bytes.Contains(b, []byte(`"error"`)) {
		t.Fatalf("unknown model: %d %s", code, b)
	}
	h.NoRender = true
	if code, b = post(tokenize.RenderChatPath, chat); code != 404 || bytes.Contains(b, []byte(`"error"`)) || h.RenderMisses() != 1 {
		t.Fatalf("no render: %d %s", code, b)
	}
}

func ExampleChat() {
	ids := standin.Chat([]tokenize.Message{{Role: "user", Content: "hi there"}}, true)
	fmt.Println(len(ids), ids[0] == standin.BOS(), ids[len(ids)-1] == standin.Header("assistant"))
	// Output: 5 true true
}
