package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/internal/defaults"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// DiffArgs are kvindexctl diff's arguments.
type DiffArgs struct {
	// Other is the second server's address (the first is Config.Addr).
	Other string
	// Worker, when set, compares only that worker, block by block.
	Worker string
	// Model, when set, compares only that model's workers.
	Model string
	// PageSize is Dump's page size; MaxShown bounds the keys listed per
	// side and worker (0: 20).
	PageSize uint32
	MaxShown int
}

// WorkerDiff is one worker's comparison between two servers.
type WorkerDiff struct {
	// Worker is "pod/rank"; Model its model.
	Worker string `json:"worker"`
	Model  string `json:"model"`
	// State is "equal", "differs", "only_a" or "only_b".
	State string `json:"state"`
	// DigestA and DigestB are the digests, as hex.
	DigestA string `json:"digest_a,omitempty"`
	DigestB string `json:"digest_b,omitempty"`
	// OnlyA, OnlyB and MediaDiffer count keys held on one side only, or
	// in other media; the lists show the first MaxShown of each.
	OnlyA       int      `json:"only_a"`
	OnlyB       int      `json:"only_b"`
	MediaDiffer int      `json:"media_differ"`
	OnlyAKeys   []string `json:"only_a_keys,omitempty"`
	OnlyBKeys   []string `json:"only_b_keys,omitempty"`
	MediaKeys   []string `json:"media_keys,omitempty"`
	// Changed says a side changed while it was read (retry for an exact
	// answer).
	Changed bool `json:"changed,omitempty"`
}

// DiffResult is kvindexctl diff's answer.
type DiffResult struct {
	A       string       `json:"a"`
	B       string       `json:"b"`
	Workers []WorkerDiff `json:"workers"`
}

// Diff compares two servers (two replicas, or a replica and the server it
// follows): every worker's digest, then, for workers whose digests
// differ, their keys block by block.
func Diff(ctx context.Context, cfg Config, args DiffArgs) error {
	if args.Other == "" {
		return errors.New("--other: required (the second server's address)")
	}
	var only *kvindexv1.WorkerRef
	if args.Worker != "" {
		var err error
		if only, err = ParseWorker(args.Worker); err != nil {
			return fmt.Errorf("--worker: %w", err)
		}
	}
	defaults.Positive(&args.MaxShown, 20)
	cfgB := cfg
	cfgB.Addr = args.Other
	return withClient(ctx, cfg, func(ctx context.Context, a *api.Client) error {
		return withClient(ctx, cfgB, func(ctx context.Context, b *api.Client) error {
			res, err := diff(ctx, cfg.Addr, a, args.Other, b, only, args)
			if err != nil {
				return err
			}
			if cfg.JSON {
				return writeJSONValue(cfg.Out, res, true)
			}
			return RenderDiff(cfg.Out, res)
		})
	})
}

func diff(ctx context.Context, addrA string, a *api.Client, addrB string, b *api.Client, only *kvindexv1.WorkerRef, args DiffArgs) (*DiffResult, error) {
	list := func(addr string, c *api.Client) (map[string]*kvindexv1.WorkerStatus, error) {
		resp, err := c.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{Model: args.Model, Digests: true})
		if err != nil {
			return nil, callError("diff", addr, err)
		}
		out := map[string]*kvindexv1.WorkerStatus{}
		for _, ws := range resp.GetWorkers() {
			if ws.GetModel() == "" {
				continue // known to the subscriber only
			}
			if only != nil && (ws.GetWorker().GetPod() != only.GetPod() || ws.GetWorker().GetDpRank() != only.GetDpRank()) {
				continue
			}
			out[WorkerName(ws.GetWorker())] = ws
		}
		return out, nil
	}
	la, err := list(addrA, a)
	if err != nil {
		return nil, err
	}
	lb, err := list(addrB, b)
	if err != nil {
		return nil, err
	}
	names := slices.Collect(maps.Keys(la))
	for n := range lb {
		if la[n] == nil {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	res := &DiffResult{A: addrA, B: addrB}
	for _, n := range names {
		wa, wb := la[n], lb[n]
		wd := WorkerDiff{Worker: n}
		switch {
		case wb == nil:
			wd.State, wd.Model, wd.DigestA = "only_a", wa.GetModel(), hex(wa.GetDigest())
		case wa == nil:
			wd.State, wd.Model, wd.DigestB = "only_b", wb.GetModel(), hex(wb.GetDigest())
		case wa.GetDigest() == wb.GetDigest() && wa.GetModel() == wb.GetModel():
			wd.State, wd.Model, wd.DigestA, wd.DigestB = "equal", wa.GetModel(), hex(wa.GetDigest()), hex(wb.GetDigest())
		default:
			wd.State, wd.Model, wd.DigestA, wd.DigestB = "differs", wa.GetModel(), hex(wa.GetDigest()), hex(wb.GetDigest())
			if err := blockDiff(ctx, addrA, a, addrB, b, wa.GetWorker(), args, &wd); err != nil {
				return nil, err
			}
		}
		res.Workers = append(res.Workers, wd)
	}
	return res, nil
}

// blockDiff compares one worker's keys on both servers.
func blockDiff(ctx context.Context, addrA string, a *api.Client, addrB string, b *api.Client, ref *kvindexv1.WorkerRef, args DiffArgs, wd *WorkerDiff) error {
	da, err := ReadDump(ctx, a, ref, args.PageSize, 0)
	if err != nil {
		return callError("diff", addrA, err)
	}
	db, err := ReadDump(ctx, b, ref, args.PageSize, 0)
	if err != nil {
		return callError("diff", addrB, err)
	}
	wd.Changed = da.Changed || db.Changed
	wd.DigestA, wd.DigestB = hex(da.Digest), hex(db.Digest)
	// Both are in key order: merge.
	i, j := 0, 0
	show := func(list *[]string, k uint64) {
		if len(*list) < args.MaxShown {
			*list = append(*list, hex(k))
		}
	}
	for i < len(da.Blocks) || j < len(db.Blocks) {
		switch {
		case j == len(db.Blocks) || i < len(da.Blocks) && da.Blocks[i].GetKey() < db.Blocks[j].GetKey():
			wd.OnlyA++
			show(&wd.OnlyAKeys, da.Blocks[i].GetKey())
			i++
		case i == len(da.Blocks) || db.Blocks[j].GetKey() < da.Blocks[i].GetKey():
			wd.OnlyB++
			show(&wd.OnlyBKeys, db.Blocks[j].GetKey())
			j++
		default:
			if !slices.Equal(da.Blocks[i].GetMedia(), db.Blocks[j].GetMedia()) {
				wd.MediaDiffer++
				show(&wd.MediaKeys, da.Blocks[i].GetKey())
			}
			i++
			j++
		}
	}
	if wd.OnlyA == 0 && wd.OnlyB == 0 && wd.MediaDiffer == 0 && da.Digest == db.Digest {
		wd.State = "equal" // converged between the listing and the dump
	}
	return nil
}

func hex(v uint64) string { return fmt.Sprintf("%016x", v) }

// RenderDiff prints one row per worker (WORKER, MODEL, STATE, DIGEST A,
// DIGEST B, ONLY A, ONLY B, MEDIA), then the keys that differ.
func RenderDiff(w io.Writer, res *DiffResult) error {
	fmt.Fprintf(w, "a: %s\nb: %s\n", res.A, res.B)
	if len(res.Workers) == 0 {
		_, err := fmt.Fprintln(w, "no workers")
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "WORKER\tMODEL\tSTATE\tDIGEST A\tDIGEST B\tONLY A\tONLY B\tMEDIA")
	var notes []string
	same := 0
	for _, d := range res.Workers {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n", d.Worker, d.Model, strings.ReplaceAll(d.State, "_", " "), orDash(d.DigestA), orDash(d.DigestB), d.OnlyA, d.OnlyB, d.MediaDiffer)
		if d.State == "equal" {
			same++
		}
		if len(d.OnlyAKeys) > 0 {
			notes = append(notes, fmt.Sprintf("%s: only in a: %s%s", d.Worker, strings.Join(d.OnlyAKeys, " "), more(d.OnlyA, len(d.OnlyAKeys))))
		}
		if len(d.OnlyBKeys) > 0 {
			notes = append(notes, fmt.Sprintf("%s: only in b: %s%s", d.Worker, strings.Join(d.OnlyBKeys, " "), more(d.OnlyB, len(d.OnlyBKeys))))
		}
		if len(d.MediaKeys) > 0 {
			notes = append(notes, fmt.Sprintf("%s: in other media: %s%s", d.Worker, strings.Join(d.MediaKeys, " "), more(d.MediaDiffer, len(d.MediaKeys))))
		}
		if d.Changed {
			notes = append(notes, d.Worker+": changed while it was read; run diff again for an exact answer")
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	_, err := fmt.Fprintf(w, "%d of %d workers equal\n", same, len(res.Workers))
	return err
}

func more(total, shown int) string {
	if total > shown {
		return fmt.Sprintf(" (and %d more)", total-shown)
	}
	return ""
}
