package daemon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/internal/config"
)

// loadTokens reads each configured token's secret from its file or
// environment variable. Errors name the token and where its secret should
// be, never the secret.
func loadTokens(cfg []config.Token) ([]api.Token, error) {
	out := make([]api.Token, 0, len(cfg))
	for _, t := range cfg {
		var secret string
		switch {
		case t.File != "":
			b, err := os.ReadFile(t.File)
			if err != nil {
				return nil, fmt.Errorf("daemon: token %q: read %s: %w", t.Name, t.File, err)
			}
			secret = string(bytes.TrimRight(b, "\r\n"))
		default:
			v, ok := os.LookupEnv(t.Env)
			if !ok {
				return nil, fmt.Errorf("daemon: token %q: environment variable %s is not set", t.Name, t.Env)
			}
			secret = v
		}
		if secret == "" {
			return nil, fmt.Errorf("daemon: token %q: its secret is empty", t.Name)
		}
		var scopes api.Scope
		for _, s := range t.Scopes {
			sc, err := api.ParseScope(s)
			if err != nil {
				return nil, fmt.Errorf("daemon: token %q: %w", t.Name, err)
			}
			scopes |= sc
		}
		out = append(out, api.Token{Name: t.Name, Secret: secret, Scopes: scopes})
	}
	return out, nil
}

// watchTokens re-reads the token secrets every interval and installs them
// when they changed (a rotated secret file takes effect within interval).
// A set that fails to load leaves the previous one in place, logged
// without the secrets.
func (d *Daemon) watchTokens(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last, _ := loadTokens(d.cfg.Auth.Tokens)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		toks, err := loadTokens(d.cfg.Auth.Tokens)
		if err != nil {
			d.log.Warn("token secrets changed but do not load; the previous ones stay in use", "err", err)
			continue
		}
		if equalTokens(toks, last) {
			continue
		}
		if err := d.auth.SetTokens(toks); err != nil {
			d.log.Warn("token secrets changed but are not valid; the previous ones stay in use", "err", err)
			continue
		}
		last = toks
		d.log.Info("token secrets reloaded", "tokens", len(toks))
	}
}

func equalTokens(a, b []api.Token) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
