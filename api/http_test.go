package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// serveHTTP serves srv's HTTP/JSON API, guarded by auth when not nil, on
// 127.0.0.1 until the test ends, and returns its base URL.
func serveHTTP(tb testing.TB, srv *api.Server, auth *api.Auth) string {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	hs := &http.Server{Handler: srv.HTTPHandler(auth), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = hs.Serve(lis)
	}()
	tb.Cleanup(func() {
		_ = hs.Close()
		<-done
	})
	return "http://" + lis.Addr().String()
}

// postJSON posts body to base's method with token as bearer token (none
// when empty) and returns the status and the body.
func postJSON(tb testing.TB, base, method, token, body string) (int, []byte) {
	tb.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/kvindex.v1.IndexService/"+method, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("POST %s: %v", method, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp.StatusCode, b
}

// connectError is the JSON body of a Connect error.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Details []struct {
		Type  string `json:"type"`
		Debug struct {
			Reason, Domain string
		} `json:"debug"`
	} `json:"details"`
}

func decodeError(tb testing.TB, b []byte) connectError {
	tb.Helper()
	var e connectError
	if err := json.Unmarshal(b, &e); err != nil {
		tb.Fatalf("error body %q: %v", b, err)
	}
	return e
}

// The JSON API answers Score, Route, Release and ListWorkers as gRPC does:
// the same messages, through the same methods.
func TestHTTPCalls(t *testing.T) {
	f, ws := newRouteFixture(t, 2)
	toks := prompt(7, 4)
	apply(t, ws[1], stored(700, toks, 0, 3))
	base := serveHTTP(t, f.srv, nil)
	body, err := protojson.Marshal(&kvindexv1.ScoreRequest{Model: "m", TokenIds: toks})
	if err != nil {
		t.Fatal(err)
	}

	code, b := postJSON(t, base, "Score", "", string(body))
	if code != http.StatusOK {
		t.Fatalf("Score: %d %s", code, b)
	}
	var got kvindexv1.ScoreResponse
	if err := protojson.Unmarshal(b, &got); err != nil {
		t.Fatalf("Score answer %s: %v", b, err)
	}
	want, err := f.client.Score(context.Background(), &kvindexv1.ScoreRequest{Model: "m", TokenIds: toks})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, want) || got.GetWorkers()[0].GetMatchedBlocks() != 3 {
		t.Fatalf("Score over HTTP:\n%v\nover gRPC:\n%v", &got, want)
	}

	code, b = postJSON(t, base, "Route", "", fmt.Sprintf(`{"request_id":"r1","score":%s}`, body))
	var routed kvindexv1.RouteResponse
	if err := protojson.Unmarshal(b, &routed); code != http.StatusOK || err != nil || routed.GetChosen().GetPod() != ws[1].Info().Ref.Pod {
		t.Fatalf("Route: %d %s (%v), want pod %s chosen", code, b, err, ws[1].Info().Ref.Pod)
	}
	if code, b = postJSON(t, base, "Release", "", `{"requestId":"r1"}`); code != http.StatusOK || string(b) != `{"released":true}` {
		t.Fatalf("Release: %d %s", code, b)
	}

	code, b = postJSON(t, base, "ListWorkers", "", `{}`)
	var list kvindexv1.ListWorkersResponse
	if err := protojson.Unmarshal(b, &list); code != http.StatusOK || err != nil || len(list.GetWorkers()) != 2 || list.GetWorkers()[1].GetResidentBlocks() != 3 {
		t.Fatalf("ListWorkers: %d %s (%v), want 2 workers, the second with 3 blocks", code, b, err)
	}
}

// A request the server refuses is an HTTP 400 whose message names the
// field, whether the JSON does not decode or the server's validation
// refuses it.
func TestHTTPBadField(t *testing.T) {
	f, _ := newRouteFixture(t, 1)
	base := serveHTTP(t, f.srv, nil)
	for _, tc := range []struct{ method, body, field string }{
		{"Score", `{"model":"m","token_ids":["x"]}`, "field tokenIds"}, // JSON's name: protojson's error
		{"Score", `{"token_ids":[1,2]}`, "model: required"},
		{"Score", `{"model":"nope","token_ids":[1,2]}`, "model: unknown model"},
		{"Score", `{"model":"m","token_ids":[1],"prompt":"hi"}`, "token_ids, block_keys, prompt, messages: give exactly one"},
		{"Route", `{"score":{"model":"m","token_ids":[1]}}`, "request_id: required"},
		{"Release", `{"request_id":"` + strings.Repeat("x", api.MaxRequestIDBytes+1) + `"}`, "request_id: 257 bytes"},
	} {
		code, b := postJSON(t, base, tc.method, "", tc.body)
		e := decodeError(t, b)
		if code != http.StatusBadRequest || e.Code != "invalid_argument" || !strings.Contains(e.Message, tc.field) {
			t.Errorf("%s %s: %d %s, want 400 invalid_argument naming %q", tc.method, tc.body, code, b, tc.field)
		}
	}
}

// The JSON API takes the gRPC API's tokens and scopes: no or an unknown
// token is 401 with a Bearer challenge, a read token on Route is 403, and
// the refusals count under ListenerHTTP.
func TestHTTPAuth(t *testing.T) {
	f, _ := newRouteFixture(t, 1)
	auth, err := api.NewAuth([]api.Token{{Name: "reader", Secret: "rs", Scopes: api.ScopeRead}, {Name: "router", Secret: "ws", Scopes: api.ScopeRead | api.ScopeRoute}}, api.AuthOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := serveHTTP(t, f.srv, auth)
	score := `{"model":"m","token_ids":[1,2,3]}`
	route := `{"request_id":"a","score":` + score + `}`
	for _, tc := range []struct {
		method, token, body string
		code                int
		errCode             string
	}{
		{"Score", "", score, http.StatusUnauthorized, "unauthenticated"},
		{"Score", "wrong", score, http.StatusUnauthorized, "unauthenticated"},
		{"Score", "rs", score, http.StatusOK, ""},
		{"ListWorkers", "rs", `{}`, http.StatusOK, ""},
		{"Route", "rs", route, http.StatusForbidden, "permission_denied"},
		{"Release", "rs", `{"request_id":"a"}`, http.StatusForbidden, "permission_denied"},
		{"Route", "ws", route, http.StatusOK, ""},
		{"Release", "ws", `{"request_id":"a"}`, http.StatusOK, ""},
	} {
		code, b := postJSON(t, base, tc.method, tc.token, tc.body)
		if code != tc.code {
			t.Errorf("%s with %q: %d %s, want %d", tc.method, tc.token, code, b, tc.code)
			continue
		}
		if tc.errCode != "" {
			if e := decodeError(t, b); e.Code != tc.errCode || !strings.Contains(e.Message, "/kvindex.v1.IndexService/"+tc.method) {
				t.Errorf("%s with %q: %s, want %s naming the method", tc.method, tc.token, b, tc.errCode)
			}
		}
	}
	got := map[string]int64{}
	for _, r := range auth.RefusalsByListener() {
		got[r.Listener+"/"+r.Reason] = r.N
	}
	if got["http/unauthenticated"] != 2 || got["http/denied"] != 2 {
		t.Fatalf("refusals %v, want 2 unauthenticated and 2 denied on http", got)
	}
}

// Admission control holds on the JSON API: with max_pending 1 taken by a
// request whose body has not arrived, a Score is refused 429 with the
// OVERLOADED detail before its body is read, and the held call stops
// counting as pending once its client goes.
func TestHTTPOverload(t *testing.T) {
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	mustWorker(t, ix, "m", "pod-0", 0)
	srv := api.NewServer(ix, nil, api.Options{Admission: api.AdmissionOptions{MaxPending: 1, Target: time.Second, MaxQueueDelay: 10 * time.Second}})
	base := serveHTTP(t, srv, nil)

	held, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(held, "POST /kvindex.v1.IndexService/Score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
	waitFor(t, func() bool { return srv.AdmissionStats().Pending == 1 })

	code, b := postJSON(t, base, "Score", "", `{"model":"m","token_ids":[1,2,3]}`)
	e := decodeError(t, b)
	if code != http.StatusTooManyRequests || e.Code != "resource_exhausted" || !strings.Contains(e.Message, "overloaded") ||
		len(e.Details) != 1 || e.Details[0].Debug.Reason != api.OverloadReason || e.Details[0].Debug.Domain != api.ErrorDomain {
		t.Fatalf("Score past max_pending: %d %s, want 429 resource_exhausted with the OVERLOADED detail", code, b)
	}
	if st := srv.AdmissionStats(); st.RefusedPending != 1 {
		t.Fatalf("admission stats %+v, want 1 refused pending", st)
	}
	_ = held.Close()
	waitFor(t, func() bool { return srv.AdmissionStats().Pending == 0 })
	if code, b := postJSON(t, base, "Score", "", `{"model":"m","token_ids":[1,2,3]}`); code != http.StatusOK || !bytes.Contains(b, []byte(`"blockSize":16`)) {
		t.Fatalf("Score after the held call ended: %d %s", code, b)
	}
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(tb testing.TB, cond func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatal("condition not met within 10 s")
		}
	}
}

// The JSON API applies the server's limits: token_ids over MaxTokens is
// 400 naming the field, and a body over MaxJSONBytes is refused before it
// is decoded.
func TestHTTPLimits(t *testing.T) {
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	srv := api.NewServer(ix, nil, api.Options{MaxTokens: 4, MaxBlockKeys: 4})
	base := serveHTTP(t, srv, nil)
	code, b := postJSON(t, base, "Score", "", `{"model":"m","token_ids":[1,2,3,4,5]}`)
	if e := decodeError(t, b); code != http.StatusBadRequest || e.Message != "token_ids: 5 tokens exceed the limit of 4" {
		t.Fatalf("5 tokens, limit 4: %d %s", code, b)
	}
	huge := `{"model":"m","tenant":"` + strings.Repeat("x", srv.MaxJSONBytes()) + `"}`
	code, b = postJSON(t, base, "Score", "", huge)
	if e := decodeError(t, b); code != http.StatusTooManyRequests || e.Code != "resource_exhausted" || !strings.Contains(e.Message, "larger than configured max") {
		t.Fatalf("a %d-byte body, limit %d: %d %s, want 429 resource_exhausted", len(huge), srv.MaxJSONBytes(), code, b)
	}
}
