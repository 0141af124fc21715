package integration

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testcerts"
)

// TestHTTPJSONOverTLS: with TLS on, the HTTP/JSON API (http_listen) is
// served over the gRPC API's mTLS only, with its tokens; a request routed
// over JSON belongs to its token's client, who releases it over gRPC;
// refusals count under listener "http".
func TestHTTPJSONOverTLS(t *testing.T) {
	s := newSecureFleet(t)
	base := s.d.HTTPAddr() + "/kvindex.v1.IndexService/"
	post := func(hc *http.Client, url, token, body string) (int, string, error) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	score := `{"model":"` + model + `","token_ids":[1,2,3]}`
	if code, _, err := post(http.DefaultClient, "http://"+base+"Score", readSecret, score); err == nil && code == http.StatusOK {
		t.Fatal("plaintext HTTP was served")
	}
	if _, _, err := post(httpsClient(t, s.ca.File, testcerts.Pair{}), "https://"+base+"Score", readSecret, score); err == nil {
		t.Fatal("HTTPS without a client certificate was served")
	}
	hc := httpsClient(t, s.ca.File, s.client)
	for _, tc := range []struct {
		method, token, body string
		code                int
	}{
		{"Score", readSecret, score, http.StatusOK},
		{"Score", "", score, http.StatusUnauthorized},
		{"Route", readSecret, `{"request_id":"h1","score":` + score + `}`, http.StatusForbidden},
		{"Route", routeSecret, `{"request_id":"h1","score":` + score + `}`, http.StatusOK},
	} {
		if code, body, err := post(hc, "https://"+base+tc.method, tc.token, tc.body); err != nil || code != tc.code {
			t.Fatalf("%s over HTTPS: %d %s (%v), want %d", tc.method, code, body, err, tc.code)
		}
	}
	m := s.metricsTLS(t, readSecret)
	for _, want := range []string{`kvindex_auth_refused_total{listener="http",reason="unauthenticated"} 1`, `kvindex_auth_refused_total{listener="http",reason="denied"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	released, err := s.dial(t, routeSecret).Release(context.Background(), "h1")
	if err != nil || !released {
		t.Fatalf("gRPC Release of the request routed over HTTPS: %v, %v; want released", released, err)
	}
}
