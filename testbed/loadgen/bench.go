package loadgen

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvindex/kvindex/api"
)

// Options is one kvbench run (its flags say what each field is).
// Embedded starts an in-process index loaded with Shape instead of
// dialling Addr. Check verifies every reply against Shape (Embedded
// implies it). Warmup is run first, unmeasured (a zero Duration skips
// it).
type Options struct {
	Addr        string
	Embedded    bool
	Shape       Shape
	BlockKeys   bool
	Check       bool
	Client      string // "grpc" (default) or "grpc-preencoded"
	Connections int    // 0: one per sender
	Load        Config
	Warmup      Config
}

// Bench runs a whole kvbench session: start the embedded server or dial
// Addr, open one connection per sender, warm up, run the measured load,
// and return its report.
func Bench(ctx context.Context, opts Options) (*Report, error) {
	switch opts.Client {
	case "":
		opts.Client = "grpc"
	case "grpc", "grpc-preencoded":
	default:
		return nil, fmt.Errorf("loadgen: client %q: want grpc or grpc-preencoded", opts.Client)
	}
	addr := opts.Addr
	if opts.Embedded {
		e, err := StartEmbedded(ctx, opts.Shape, "", api.Options{})
		if err != nil {
			return nil, err
		}
		defer e.Close()
		addr = e.Addr
	} else if addr == "" {
		return nil, errors.New("loadgen: no target: give an address or use the embedded server")
	}
	check := opts.Check || opts.Embedded
	nconn := opts.Connections
	if nconn <= 0 {
		nconn = max(opts.Load.Concurrency, 1)
	}
	clients := make([]*api.Client, nconn)
	for i := range clients {
		c, err := api.Dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		clients[i] = c
	}
	do, err := ScoreDo(opts.Shape, clients, opts.BlockKeys, check, opts.Client == "grpc-preencoded")
	if err != nil {
		return nil, err
	}
	var warm int64
	if opts.Warmup.Duration > 0 {
		r, err := Run(ctx, opts.Warmup, do)
		if err != nil {
			return nil, fmt.Errorf("loadgen: warm-up: %w", err)
		}
		if r.Errors == r.Sent && r.Sent > 0 {
			return nil, fmt.Errorf("loadgen: warm-up: every request to %s failed, first: %s", addr, r.FirstError)
		}
		warm = r.Sent
	}
	r, err := Run(ctx, opts.Load, do)
	if err != nil {
		return nil, err
	}
	rep := NewReport(addr, opts.Embedded, opts.Shape, opts.BlockKeys, opts.Load, r)
	rep.Client, rep.Connections, rep.Checked, rep.WarmupSent = opts.Client, nconn, check, warm
	return &rep, nil
}
