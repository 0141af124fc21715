package redact

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"http://10.0.0.5:8000/metrics", "http://10.0.0.5:8000/metrics"},
		{"https://user:pw@10.0.0.5/metrics", "https://user:REDACTED@10.0.0.5/metrics"},
		{"https://user@10.0.0.5/metrics", "https://user@10.0.0.5/metrics"},
		{"http://h/metrics?token=abc&x=1", "http://h/metrics?token=REDACTED&x=1"},
		{"http://h/m?X-Amz-Signature=s&api_key=k&Access_Token=t", "http://h/m?Access_Token=REDACTED&X-Amz-Signature=REDACTED&api_key=REDACTED"},
		{"::not a url with token=x", "REDACTED"},
	} {
		if got := URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestErr(t *testing.T) {
	inner := errors.New("connection refused")
	err := &url.Error{Op: "Get", URL: "http://h/m?token=secret", Err: inner}
	if got := Err(err); got != inner || strings.Contains(got.Error(), "secret") {
		t.Fatalf("Err = %v", got)
	}
	if got := Err(inner); got != inner {
		t.Fatalf("Err of a plain error = %v", got)
	}
}
