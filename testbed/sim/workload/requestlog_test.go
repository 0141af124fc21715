package workload

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestFromTokensSharesExactlyTheSharedRuns(t *testing.T) {
	a := make([]uint32, 40)
	b := make([]uint32, 40)
	for i := range a {
		a[i], b[i] = uint32(i), uint32(i)
	}
	b[20] = 999 // differs in the second 16-token run
	ra, rb := FromTokens(0, a, 0), FromTokens(0, b, 5)
	if len(ra.Prompt) != 3 || ra.Prompt[2].Len != 8 || ra.PromptLen != 40 || ra.OutputLen != DefaultLogOutputTokens || rb.OutputLen != 5 {
		t.Fatalf("request %+v", ra)
	}
	if ra.Prompt[0] != rb.Prompt[0] || ra.Prompt[1] == rb.Prompt[1] || ra.Prompt[2] == rb.Prompt[2] {
		t.Fatalf("segments a %v b %v: want the first equal, the rest different", ra.Prompt, rb.Prompt)
	}
	// A prompt that is a prefix of another shares its runs.
	if c := FromTokens(0, a[:16], 0); c.Prompt[0] != ra.Prompt[0] {
		t.Fatal("a prompt that is a prefix of another does not share its first run")
	}
}

func TestReadTokenLog(t *testing.T) {
	log := `{"timestamp": 2000, "token_ids": [1,2,3], "output_length": 4}

{"timestamp": 1000, "token_ids": [5,6]}
`
	w, err := ReadTokenLog(strings.NewReader(log), "mine")
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 2 || w.Requests[0].PromptLen != 2 || w.Requests[0].Arrival != time.Second || w.Requests[1].OutputLen != 4 || w.Requests[1].ID != 1 {
		t.Fatalf("log read as %+v", w.Requests)
	}
	for _, bad := range []string{`{"timestamp": 1}`, `{"token_ids": [1], "timestamp": -1}`, `not json`, ``} {
		if _, err := ReadTokenLog(strings.NewReader(bad), "bad"); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	_, err = ReadTokenLog(strings.NewReader("{\"token_ids\": [1]}\n{\"token_ids\": []}\n"), "bad")
	if err == nil || !strings.Contains(err.Error(), "bad line 2") {
		t.Errorf("error %v does not name line 2", err)
	}
}

func TestReadOpenAILogEstimated(t *testing.T) {
	sys := strings.Repeat("You are a helpful assistant. ", 20)
	line := func(q string, ts int) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "timestamp": ts, "max_tokens": 64,
			"messages": []map[string]string{{"role": "system", "content": sys}, {"role": "user", "content": q}}})
		return string(b)
	}
	log := line("What is a KV cache?", 0) + "\n" + line("How do I route by prefix?", 0) + "\n" + `{"prompt": "plain text prompt", "timestamp": 5000}` + "\n"
	w, err := ReadOpenAILog(strings.NewReader(log), "chat", EstimateTokens)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 3 || w.Requests[1].Arrival != time.Second || w.Requests[2].Arrival != 5*time.Second || w.Requests[0].OutputLen != 64 {
		t.Fatalf("requests %+v", w.Requests)
	}
	// "system: " + 580 characters + "\n" + "user: ...": about 150 estimated
	// tokens each, the system prompt's runs shared.
	a, b := w.Requests[0], w.Requests[1]
	if a.PromptLen < 140 || a.PromptLen > 160 {
		t.Errorf("estimated %d tokens for ~600 characters", a.PromptLen)
	}
	shared := 0
	for shared < min(len(a.Prompt), len(b.Prompt)) && a.Prompt[shared] == b.Prompt[shared] {
		shared++
	}
	if shared*16 < 130 || shared == len(a.Prompt) {
		t.Errorf("the two chats share %d estimated tokens, want the system prompt's ~147 and no more", shared*16)
	}
	if _, err := ReadOpenAILog(strings.NewReader(`{"model": "m"}`), "bad", EstimateTokens); err == nil {
		t.Error("a body without prompt or messages: no error")
	}
}
