package daemon

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/metrics"
)

// Auth is a process's authentication: one api.Auth that every listener of
// the process enforces, so one token table, one rotation and one refusal
// counter cover them all. Run owns the reload; everything else is safe for
// concurrent use.
type Auth struct {
	*api.Auth
	tokens []config.Token
	loaded []api.Token // the secrets NewAuth installed
	log    *slog.Logger
	// reloads and failures count token tables installed after a change,
	// and changes that did not load or were not valid.
	reloads, failures atomic.Int64
}

// NewAuth returns the authentication cfg configures, nil when it
// configures none (no tokens, no certificate identities).
func NewAuth(cfg *config.Auth, log *slog.Logger) (*Auth, error) {
	if len(cfg.Tokens) == 0 && !cfg.CertIdentity {
		return nil, nil
	}
	defaults.Zero(&log, slog.New(slog.DiscardHandler))
	toks, err := loadTokens(cfg.Tokens)
	if err != nil {
		return nil, err
	}
	a, err := api.NewAuth(toks, api.AuthOptions{OpenHealth: cfg.OpenHealth, CertIdentity: cfg.CertIdentity})
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	return &Auth{Auth: a, tokens: cfg.Tokens, loaded: toks, log: log}, nil
}

// loadTokens reads each token's secret. Errors name the token and where
// its secret should be, never the secret.
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

// Run re-reads the token secrets every interval until ctx is done, and
// installs them when they changed. A set that fails to load leaves the
// previous one in place, counted and logged without the secrets.
func (a *Auth) Run(ctx context.Context, interval time.Duration) {
	if len(a.tokens) == 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	last := a.loaded
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		toks, err := loadTokens(a.tokens)
		if err != nil {
			a.failures.Add(1)
			a.log.Warn("token secrets changed but do not load; the previous ones stay in use", "err", err)
			continue
		}
		if slices.Equal(toks, last) {
			continue
		}
		if err := a.SetTokens(toks); err != nil {
			a.failures.Add(1)
			a.log.Warn("token secrets changed but are not valid; the previous ones stay in use", "err", err)
			continue
		}
		last = toks
		a.reloads.Add(1)
		a.log.Info("token secrets reloaded", "tokens", len(toks))
	}
}

// Reloads counts the token tables installed after a change of the
// secrets: a rotation has taken effect once it moved.
func (a *Auth) Reloads() int64 { return a.reloads.Load() }

// Collectors are the authentication's metrics.
func (a *Auth) Collectors() []prometheus.Collector {
	refused := prometheus.NewDesc("kvindex_auth_refused_total", "Calls refused by authentication, by listener (grpc, http, gateway, metrics) and reason: unauthenticated (no or unknown credential) or denied (a scope missing).", []string{"listener", "reason"}, nil)
	return []prometheus.Collector{
		metrics.NewFunc(func(ch chan<- prometheus.Metric) {
			for _, r := range a.RefusalsByListener() {
				ch <- prometheus.MustNewConstMetric(refused, prometheus.CounterValue, float64(r.N), r.Listener, r.Reason)
			}
		}, refused),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_auth_token_reloads_total", Help: "Token tables installed after a change of the token secrets (a rotation took effect on every listener)."},
			func() float64 { return float64(a.reloads.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_auth_token_reload_failures_total", Help: "Re-reads of the token secrets that did not load or were not valid (the previous tokens stayed in use)."},
			func() float64 { return float64(a.failures.Load()) }),
	}
}
