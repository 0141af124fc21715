package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/api"
)

// ErrNotServing reports a health check whose answer is not SERVING (or,
// over HTTP, not 200).
var ErrNotServing = errors.New("ctl: not serving")

// Health asks the server's standard gRPC health service (grpc.health.v1)
// about service ("" for the server as a whole) and prints the status; it
// returns ErrNotServing unless the status is SERVING, so that `kvindexctl
// health` is a container health check.
func Health(ctx context.Context, cfg Config, service string) error {
	return withClient(ctx, cfg, func(ctx context.Context, c *api.Client) error {
		resp, err := healthpb.NewHealthClient(c.Conn()).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			return callError("health", cfg.Addr, err)
		}
		fmt.Fprintln(cfg.Out, resp.GetStatus())
		if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		what := "the server"
		if service != "" {
			what = "service " + service
		}
		return fmt.Errorf("%w: %s at %s is %s", ErrNotServing, what, cfg.Addr, resp.GetStatus())
	})
}

// HealthHTTP GETs url (a kvindex agent's /healthz) with cfg.Token and
// cfg.TLS, and returns ErrNotServing unless it answers 200.
func HealthHTTP(ctx context.Context, cfg Config, url string) error {
	ctx, cancel := cfg.deadline(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("health %s: %w", url, err)
	}
	if cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.Token)
	}
	client := http.DefaultClient
	if cfg.TLS.Enabled() {
		tc, err := cfg.TLS.client().Config()
		if err != nil {
			return err
		}
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("health %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %s answered %s", ErrNotServing, url, resp.Status)
	}
	fmt.Fprintln(cfg.Out, strings.TrimSpace(string(body)))
	return nil
}
