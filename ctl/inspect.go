package ctl

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// Lookup prints which workers hold each block of a prompt.
func Lookup(ctx context.Context, cfg Config, args PromptArgs) error {
	p, err := args.prompt(cfg.Stdin)
	if err != nil {
		return err
	}
	req := &kvindexv1.LookupRequest{Model: args.Model, TokenIds: p.GetTokenIds(), Prompt: p.GetPrompt(), Messages: p.GetMessages(), LoraName: args.LoRA, CacheSalt: args.CacheSalt}
	return printCall(ctx, cfg, "lookup", func(ctx context.Context, c *api.Client) (*kvindexv1.LookupResponse, error) {
		return c.Lookup(ctx, req)
	}, RenderLookup)
}

// RenderLookup prints one row per run of blocks: BLOCKS, KEYS (first and
// last), HOLDERS (worker, media and health when not OK).
func RenderLookup(w io.Writer, resp *kvindexv1.LookupResponse) error {
	fmt.Fprintf(w, "%d blocks of %d tokens; %d indexed from the first\n", resp.GetPromptBlocks(), resp.GetBlockSize(), resp.GetIndexedBlocks())
	tw := newTable(w)
	fmt.Fprintln(tw, "BLOCKS\tFIRST KEY\tHOLDERS")
	keys := resp.GetKeys()
	end := uint32(0)
	for _, r := range resp.GetRuns() {
		var hs []string
		for _, h := range r.GetHolders() {
			s := WorkerName(h.GetWorker()) + " " + strings.Join(h.GetMedia(), "+")
			if h.GetHealth() != kvindexv1.WorkerHealth_WORKER_HEALTH_OK && h.GetHealth() != kvindexv1.WorkerHealth_WORKER_HEALTH_UNSPECIFIED {
				s += " (" + healthName(h.GetHealth()) + ")"
			}
			hs = append(hs, s)
		}
		if len(hs) == 0 {
			hs = []string{"none (kept as parents)"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", blockRange(r.GetFirstBlock(), r.GetEndBlock()), keyAt(keys, r.GetFirstBlock()), strings.Join(hs, ", "))
		end = r.GetEndBlock()
	}
	if end < resp.GetPromptBlocks() {
		fmt.Fprintf(tw, "%s\t%s\tnone\n", blockRange(end, resp.GetPromptBlocks()), keyAt(keys, end))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if resp.GetTruncated() {
		_, err := fmt.Fprintf(w, "truncated at the server's bound of %d holder entries\n", api.MaxLookupHolders)
		return err
	}
	return nil
}

func blockRange(from, to uint32) string {
	if to == from+1 {
		return strconv.FormatUint(uint64(from), 10)
	}
	return fmt.Sprintf("%d-%d", from, to-1)
}

func keyAt(keys []uint64, i uint32) string {
	if int(i) < len(keys) {
		return hex(keys[i])
	}
	return "-"
}

func healthName(h kvindexv1.WorkerHealth) string {
	return strings.TrimPrefix(h.String(), "WORKER_HEALTH_")
}

// DiagnoseArgs are kvindexctl diagnose's arguments.
type DiagnoseArgs struct {
	PromptArgs
	// Worker is "pod/rank".
	Worker string
	// EngineHashes are the engine's block hashes for the prompt
	// (decimal or 0x hex, comma or space separated), for the parity check.
	EngineHashes string
}

// ParseHashes reads block hashes, decimal or 0x-prefixed hex, separated
// by commas or white space, or a JSON array of numbers.
func ParseHashes(s string) ([]uint64, error) {
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	var out []uint64
	for i, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' }) {
		v, err := strconv.ParseUint(f, 0, 64)
		if err != nil {
			// vLLM's hashes are Python ints; a negative one is the
			// two's complement of its 64 bits.
			n, nerr := strconv.ParseInt(f, 0, 64)
			if nerr != nil {
				return nil, fmt.Errorf("hash %d %q: not a 64-bit integer", i, snippet(f))
			}
			v = uint64(n)
		}
		out = append(out, v)
	}
	return out, nil
}

// Diagnose prints why a worker misses a prompt.
func Diagnose(ctx context.Context, cfg Config, args DiagnoseArgs) error {
	p, err := args.prompt(cfg.Stdin)
	if err != nil {
		return err
	}
	ref, err := ParseWorker(args.Worker)
	if err != nil {
		return fmt.Errorf("--worker: %w", err)
	}
	req := &kvindexv1.DiagnoseRequest{Model: args.Model, TokenIds: p.GetTokenIds(), Prompt: p.GetPrompt(), Messages: p.GetMessages(),
		LoraName: args.LoRA, CacheSalt: args.CacheSalt, Worker: ref}
	if args.EngineHashes != "" {
		if req.EngineBlockHashes, err = ParseHashes(args.EngineHashes); err != nil {
			return fmt.Errorf("--engine-hashes: %w", err)
		}
	}
	return printCall(ctx, cfg, "diagnose", func(ctx context.Context, c *api.Client) (*kvindexv1.DiagnoseResponse, error) {
		return c.Diagnose(ctx, req)
	}, RenderDiagnose)
}

// RenderDiagnose prints the worker's match, each finding (the most likely
// first) and the parity check.
func RenderDiagnose(w io.Writer, d *kvindexv1.DiagnoseResponse) error {
	h := healthName(d.GetHealth())
	if d.GetHealthReason() != "" {
		h += " (" + d.GetHealthReason() + ")"
	}
	fmt.Fprintf(w, "worker %s  model %s  health %s\n", WorkerName(d.GetWorker()), orDash(d.GetModel()), h)
	if d.GetMatchedBlocks() < d.GetPromptBlocks() {
		fmt.Fprintf(w, "holds %d of %d blocks; first miss: block %d (key %016x)\n", d.GetMatchedBlocks(), d.GetPromptBlocks(), d.GetMatchedBlocks(), d.GetFirstMissKey())
	} else {
		fmt.Fprintf(w, "holds %d of %d blocks\n", d.GetMatchedBlocks(), d.GetPromptBlocks())
	}
	for i, f := range d.GetFindings() {
		mark := "  "
		if i == 0 {
			mark = "=>"
		}
		reason := strings.ReplaceAll(strings.TrimPrefix(f.GetReason().String(), "DIAGNOSE_REASON_"), "_", " ")
		fmt.Fprintf(w, "%s %s: %s\n", mark, strings.ToLower(reason), f.GetDetail())
	}
	if p := d.GetParity(); p != nil {
		fmt.Fprintf(w, "parity: %s: %s (engine blocks %d, held %d, agreeing %d)\n",
			strings.ToLower(strings.TrimPrefix(p.GetVerdict().String(), "PARITY_VERDICT_")), p.GetDetail(), p.GetEngineBlocks(), p.GetKnownBlocks(), p.GetAgreedBlocks())
	}
	_, err := fmt.Fprintf(w, "removal record: the last %d removals\n", d.GetHistoryRemovals())
	return err
}
