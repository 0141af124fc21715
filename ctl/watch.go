package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// WatchArgs are kvindexctl watch's arguments.
type WatchArgs struct {
	// Model and Workers ("pod/rank") filter by worker.
	Model   string
	Workers []string
	// Kinds filter by kind: stored, removed, cleared, reset, delta, restored.
	Kinds []string
	// Buffer is the stream's queue on the server (0: its default).
	Buffer uint32
	// Hashes asks for the events' block hashes.
	Hashes bool
	// Count stops after this many events (0: until interrupted).
	Count int
}

// WatchRequest builds the request args describe.
func (a WatchArgs) WatchRequest() (*kvindexv1.WatchRequest, error) {
	req := &kvindexv1.WatchRequest{Model: a.Model, Buffer: a.Buffer, Hashes: a.Hashes}
	for _, s := range a.Workers {
		r, err := ParseWorker(s)
		if err != nil {
			return nil, fmt.Errorf("--worker: %w", err)
		}
		req.Workers = append(req.Workers, r)
	}
	for _, k := range a.Kinds {
		v, ok := kvindexv1.WatchEventKind_value["WATCH_EVENT_KIND_"+strings.ToUpper(k)]
		if !ok || v == 0 {
			return nil, fmt.Errorf("--kind %q: want stored, removed, cleared, reset, delta or restored", snippet(k))
		}
		req.Kinds = append(req.Kinds, kvindexv1.WatchEventKind(v))
	}
	return req, nil
}

// Watch prints applied events as they arrive, one a line (JSON lines with
// Config.JSON), until ctx ends or Count events were printed.
func Watch(ctx context.Context, cfg Config, args WatchArgs) error {
	req, err := args.WatchRequest()
	if err != nil {
		return err
	}
	// A stream has no deadline but the caller's.
	cfg.Timeout = 0
	return withClient(ctx, cfg, func(ctx context.Context, c *api.Client) error {
		st, err := c.Watch(ctx, req)
		if err != nil {
			return callError("watch", cfg.Addr, err)
		}
		var dropped uint64
		for n := 0; args.Count == 0 || n < args.Count; n++ {
			ev, err := st.Recv()
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, io.EOF) {
					return nil
				}
				return callError("watch", cfg.Addr, err)
			}
			if cfg.JSON {
				b, err := protojson.Marshal(ev)
				if err != nil {
					return fmt.Errorf("render WatchResponse as JSON: %w", err)
				}
				if _, err := fmt.Fprintf(cfg.Out, "%s\n", b); err != nil {
					return err
				}
				continue
			}
			if ev.GetDropped() > dropped {
				fmt.Fprintf(cfg.Out, "-- %d events dropped: this reader was slower than the index (raise --buffer)\n", ev.GetDropped()-dropped)
				dropped = ev.GetDropped()
			}
			if err := RenderWatchEvent(cfg.Out, ev); err != nil {
				return err
			}
		}
		return nil
	})
}

// RenderWatchEvent prints one event: time, worker, model, kind, blocks,
// medium, and what else it carries.
func RenderWatchEvent(w io.Writer, ev *kvindexv1.WatchResponse) error {
	var b strings.Builder
	ts := "-"
	if ev.GetTime() != nil {
		ts = ev.GetTime().AsTime().UTC().Format("15:04:05.000")
	}
	kind := strings.ToLower(strings.TrimPrefix(ev.GetKind().String(), "WATCH_EVENT_KIND_"))
	fmt.Fprintf(&b, "%s %s %s %s", ts, WorkerName(ev.GetWorker()), ev.GetModel(), kind)
	switch ev.GetKind() {
	case kvindexv1.WatchEventKind_WATCH_EVENT_KIND_STORED, kvindexv1.WatchEventKind_WATCH_EVENT_KIND_REMOVED:
		fmt.Fprintf(&b, " %d blocks %s", ev.GetBlocks(), ev.GetMedium())
	case kvindexv1.WatchEventKind_WATCH_EVENT_KIND_DELTA:
		fmt.Fprintf(&b, " %d keys", ev.GetBlocks())
	case kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESET:
		fmt.Fprintf(&b, " (%s)", orDash(ev.GetReason()))
	case kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESTORED:
		fmt.Fprintf(&b, " from %s, %d blocks", orDash(ev.GetReason()), ev.GetBlocks())
	}
	if ev.GetLoraName() != "" {
		fmt.Fprintf(&b, " lora=%s", ev.GetLoraName())
	}
	if hs := ev.GetBlockHashes(); len(hs) > 0 {
		parts := make([]string, len(hs))
		for i, h := range hs {
			parts[i] = hex(h)
		}
		fmt.Fprintf(&b, " [%s]", strings.Join(parts, " "))
	}
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}
