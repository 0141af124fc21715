package standin_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/tokenize/standin"
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
	if !slices.Equal(standin.Tokens("a  b\tc", false), []uint32{standin.Word("a"), standin.Word("b"), standin.Word("c")}) {
		t.Fatal("white space is not a separator")
	}
}

func ExampleChat() {
	ids := standin.Chat([]tokenize.Message{{Role: "user", Content: "hi there"}}, true)
	fmt.Println(len(ids), ids[0] == standin.BOS, ids[len(ids)-2] == standin.MsgStart)
	// Output: 8 true true
}
