package tokenize_test

import (
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/kvindex/kvindex/tokenize"
	"github.com/kvindex/kvindex/tokenize/standin"
)

// A client asks the model's server (here the stand-in) once; the same
// chat again is answered from the cache.
func ExampleClient_Tokenize() {
	srv := httptest.NewServer(&standin.Handler{})
	defer srv.Close()
	c, err := tokenize.New(tokenize.Options{Endpoints: map[string][]string{"llama": {srv.URL}}})
	if err != nil {
		panic(err)
	}
	chat := tokenize.Request{Model: "llama", Messages: []tokenize.Message{{Role: "user", Content: "what is a KV cache?"}}}
	for range 2 {
		ids, err := c.Tokenize(context.Background(), chat)
		if err != nil {
			panic(err)
		}
		fmt.Println(len(ids), "tokens")
	}
	st := c.Stats()
	fmt.Println("hits", st.Hits, "misses", st.Misses, "rendered", st.Rendered)
	// Output:
	// 8 tokens
	// 8 tokens
	// hits 1 misses 1 rendered 1
}
