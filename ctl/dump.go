package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// DumpArgs are kvindexctl dump's arguments.
type DumpArgs struct {
	// Worker is "pod/rank".
	Worker string
	// PageSize is the keys per call (0: the server's default).
	PageSize uint32
	// MaxKeys stops after this many keys (0: all).
	MaxKeys int
}

// Dumped is a worker's resident set as read page by page.
type Dumped struct {
	// Model, Digest and Resident are the first page's.
	Model    string
	Digest   uint64
	Resident uint64
	Keyed    bool
	// Blocks are every key read, in key order.
	Blocks []*kvindexv1.ResidentBlock
	// Changed is true when the worker's digest changed between pages:
	// the pages do not describe one state.
	Changed bool
	// Truncated is true when MaxKeys stopped the reading.
	Truncated bool
}

// ReadDump reads a worker's resident keys page by page.
func ReadDump(ctx context.Context, c *api.Client, worker *kvindexv1.WorkerRef, pageSize uint32, maxKeys int) (*Dumped, error) {
	d := &Dumped{}
	token := ""
	for first := true; ; first = false {
		page, err := c.Dump(ctx, &kvindexv1.DumpRequest{Worker: worker, PageSize: pageSize, PageToken: token})
		if err != nil {
			return nil, err
		}
		if first {
			d.Model, d.Digest, d.Resident, d.Keyed = page.GetModel(), page.GetDigest(), page.GetResidentKeys(), page.GetKeyed()
		} else if page.GetDigest() != d.Digest {
			d.Changed = true
		}
		d.Blocks = append(d.Blocks, page.GetBlocks()...)
		if maxKeys > 0 && len(d.Blocks) >= maxKeys {
			d.Truncated = len(d.Blocks) > maxKeys || page.GetNextPageToken() != ""
			d.Blocks = d.Blocks[:min(len(d.Blocks), maxKeys)]
			return d, nil
		}
		if token = page.GetNextPageToken(); token == "" {
			return d, nil
		}
	}
}

// Dump prints a worker's resident keys.
func Dump(ctx context.Context, cfg Config, args DumpArgs) error {
	ref, err := ParseWorker(args.Worker)
	if err != nil {
		return fmt.Errorf("--worker: %w", err)
	}
	return withClient(ctx, cfg, func(ctx context.Context, c *api.Client) error {
		d, err := ReadDump(ctx, c, ref, args.PageSize, args.MaxKeys)
		if err != nil {
			return callError("dump", cfg.Addr, err)
		}
		if cfg.JSON {
			return WriteJSON(cfg.Out, &kvindexv1.DumpResponse{Worker: ref, Model: d.Model, Digest: d.Digest, ResidentKeys: d.Resident, Blocks: d.Blocks, Keyed: d.Keyed})
		}
		return RenderDump(cfg.Out, ref, d)
	})
}

// RenderDump prints a header (worker, model, digest, keys) and one row per
// key: KEY, MEDIA.
func RenderDump(w io.Writer, ref *kvindexv1.WorkerRef, d *Dumped) error {
	fmt.Fprintf(w, "worker %s  model %s  digest %016x  %d keys\n", WorkerName(ref), orDash(d.Model), d.Digest, d.Resident)
	if d.Changed {
		fmt.Fprintln(w, "note: the worker changed while it was read; the pages are of different states")
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "KEY\tMEDIA")
	for _, b := range d.Blocks {
		fmt.Fprintf(tw, "%016x\t%s\n", b.GetKey(), strings.Join(b.GetMedia(), "+"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if d.Truncated {
		_, err := fmt.Fprintf(w, "stopped after %d keys (--max-keys)\n", len(d.Blocks))
		return err
	}
	return nil
}
