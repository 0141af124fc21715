package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// PromptArgs are the prompt flags lookup and diagnose share with score.
type PromptArgs struct {
	// Model is the served model name.
	Model string
	// Tokens is an inline token list; give it or TokensFile.
	Tokens string
	// TokensFile is a file of tokens, "-" for stdin (see ReadTokensFile).
	TokensFile string
	// Prompt and MessagesFile give the prompt as text or as a chat (see
	// ScoreArgs), which the server tokenizes through the model's vLLM
	// server.
	Prompt, MessagesFile string
	// LoRA and CacheSalt are the request's adapter and salt.
	LoRA, CacheSalt string
}

// prompt reads the prompt: its token ids, or its text or chat.
func (a PromptArgs) prompt(stdin io.Reader) (*kvindexv1.ScoreRequest, error) {
	return ScoreArgs{Model: a.Model, Tokens: a.Tokens, TokensFile: a.TokensFile, Prompt: a.Prompt, MessagesFile: a.MessagesFile}.Request(stdin)
}

// Lookup prints which workers hold each block of a prompt.
func Lookup(ctx context.Context, cfg Config, args PromptArgs) error {
	p, err := args.prompt(cfg.Stdin)
	if err != nil {
		return err
	}
	req := &kvindexv1.LookupRequest{Model: args.Model, TokenIds: p.GetTokenIds(), Prompt: p.GetPrompt(), Messages: p.GetMessages(), LoraName: args.LoRA, CacheSalt: args.CacheSalt}
	return withClient(ctx, cfg, func(ctx context.Context, c *api.Client) error {
		resp, err := c.Lookup(ctx, req)
		if err != nil {
			return callError("lookup", cfg.Addr, err)
		}
		if cfg.JSON {
			return WriteJSON(cfg.Out, resp)
		}
		return RenderLookup(cfg.Out, resp)
	})
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
		return fmt.Sprintf("%016x", keys[i])
	}
	return "-"
}

func healthName(h kvindexv1.WorkerHealth) string {
	return strings.TrimPrefix(h.String(), "WORKER_HEALTH_")
}

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
	if args.MaxShown <= 0 {
		args.MaxShown = 20
	}
	cfgB := cfg
	cfgB.Addr = args.Other
	return withClient(ctx, cfg, func(ctx context.Context, a *api.Client) error {
		return withClient(ctx, cfgB, func(ctx context.Context, b *api.Client) error {
			res, err := diff(ctx, cfg.Addr, a, args.Other, b, only, args)
			if err != nil {
				return err
			}
			if cfg.JSON {
				return writeJSONValue(cfg.Out, res)
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
	var names []string
	for n := range la {
		names = append(names, n)
	}
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
	return withClient(ctx, cfg, func(ctx context.Context, c *api.Client) error {
		resp, err := c.Diagnose(ctx, req)
		if err != nil {
			return callError("diagnose", cfg.Addr, err)
		}
		if cfg.JSON {
			return WriteJSON(cfg.Out, resp)
		}
		return RenderDiagnose(cfg.Out, resp)
	})
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
		fmt.Fprintf(w, "%s %s: %s\n", mark, reasonName(f.GetReason()), f.GetDetail())
	}
	if p := d.GetParity(); p != nil {
		fmt.Fprintf(w, "parity: %s: %s (engine blocks %d, held %d, agreeing %d)\n",
			strings.ToLower(strings.TrimPrefix(p.GetVerdict().String(), "PARITY_VERDICT_")), p.GetDetail(), p.GetEngineBlocks(), p.GetKnownBlocks(), p.GetAgreedBlocks())
	}
	_, err := fmt.Fprintf(w, "removal record: the last %d removals\n", d.GetHistoryRemovals())
	return err
}

func reasonName(r kvindexv1.DiagnoseReason) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(r.String(), "DIAGNOSE_REASON_"), "_", " "))
}

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

// TopArgs are kvindexctl top's arguments.
type TopArgs struct {
	// Model lists only that model's workers.
	Model string
	// Interval is the refresh period (0: 2 s).
	Interval time.Duration
	// Iterations stops after this many tables (0: until interrupted).
	Iterations int
	// Clear clears the terminal before each table.
	Clear bool
}

// TopRow is one worker's line of kvindexctl top.
type TopRow struct {
	Worker       string  `json:"worker"`
	Model        string  `json:"model"`
	Health       string  `json:"health"`
	EventsPerSec float64 `json:"events_per_sec"`
	Resident     uint64  `json:"resident_blocks"`
	Gaps         uint64  `json:"gaps"`
	Replays      uint64  `json:"replays"`
	// StaleSecs is the age of the last event, in seconds (-1: never).
	StaleSecs float64 `json:"last_event_age_secs"`
	Inflight  uint32  `json:"inflight_requests"`
	// HitRatio is the predicted hit ratio of answers that ranked the
	// worker first, over the interval (-1 when none were answered); the
	// total since the server started is HitRatioTotal.
	HitRatio      float64 `json:"predicted_hit_ratio"`
	HitRatioTotal float64 `json:"predicted_hit_ratio_total"`
}

// TopRows computes top's rows from two ListWorkers answers taken dt apart
// (prev may be nil: rates are then 0).
func TopRows(prev, cur *kvindexv1.ListWorkersResponse, dt time.Duration, now time.Time) []TopRow {
	before := map[string]*kvindexv1.WorkerStatus{}
	for _, ws := range prev.GetWorkers() {
		before[WorkerName(ws.GetWorker())] = ws
	}
	var rows []TopRow
	for _, ws := range cur.GetWorkers() {
		name := WorkerName(ws.GetWorker())
		r := TopRow{
			Worker: name, Model: orDash(ws.GetModel()), Health: strings.ToLower(healthName(ws.GetHealth())),
			Resident: ws.GetResidentBlocks(), Gaps: ws.GetGaps(), Replays: ws.GetReplays(), Inflight: ws.GetInflightRequests(),
			StaleSecs: -1, HitRatio: -1, HitRatioTotal: -1,
		}
		if ws.GetLastEventTime() != nil {
			r.StaleSecs = now.Sub(ws.GetLastEventTime().AsTime()).Seconds()
		}
		if p := ws.GetScoredPromptTokens(); p > 0 {
			r.HitRatioTotal = float64(ws.GetPredictedHitTokens()) / float64(p)
		}
		if b := before[name]; b != nil && dt > 0 {
			if ws.GetEvents() >= b.GetEvents() {
				r.EventsPerSec = float64(ws.GetEvents()-b.GetEvents()) / dt.Seconds()
			}
			if dp := ws.GetScoredPromptTokens() - b.GetScoredPromptTokens(); ws.GetScoredPromptTokens() > b.GetScoredPromptTokens() {
				r.HitRatio = float64(ws.GetPredictedHitTokens()-b.GetPredictedHitTokens()) / float64(dp)
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// RenderTop prints top's table.
func RenderTop(w io.Writer, rows []TopRow) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "WORKER\tMODEL\tHEALTH\tEVENTS/S\tRESIDENT\tGAPS\tREPLAYS\tLAST EVENT\tINFLIGHT\tHIT%\tHIT% TOTAL")
	for _, r := range rows {
		last := "never"
		if r.StaleSecs >= 0 {
			last = Age(time.Duration(r.StaleSecs * float64(time.Second)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%d\t%d\t%d\t%s\t%d\t%s\t%s\n", r.Worker, r.Model, r.Health, r.EventsPerSec, r.Resident, r.Gaps, r.Replays, last, r.Inflight, pct(r.HitRatio), pct(r.HitRatioTotal))
	}
	return tw.Flush()
}

func pct(r float64) string {
	if r < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", 100*r)
}

// Top prints a per-worker table every interval: events/s, resident
// blocks, gaps, replays, staleness, in-flight requests and the predicted
// hit ratio of the answers that ranked the worker first. With Config.JSON
// each table is one JSON array a line.
func Top(ctx context.Context, cfg Config, args TopArgs) error {
	if args.Interval <= 0 {
		args.Interval = 2 * time.Second
	}
	timeout := cfg.Timeout
	cfg.Timeout = 0 // each call gets its own below
	return withClient(ctx, cfg, func(ctx context.Context, c *api.Client) error {
		var prev *kvindexv1.ListWorkersResponse
		var prevAt time.Time
		for i := 0; args.Iterations == 0 || i < args.Iterations; i++ {
			if i > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(args.Interval):
				}
			}
			cctx, cancel := ctx, context.CancelFunc(func() {})
			if timeout > 0 {
				cctx, cancel = context.WithTimeout(ctx, timeout)
			}
			cur, err := c.ListWorkers(cctx, &kvindexv1.ListWorkersRequest{Model: args.Model})
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return callError("top", cfg.Addr, err)
			}
			now := cfg.now()
			rows := TopRows(prev, cur, now.Sub(prevAt), now)
			prev, prevAt = cur, now
			if cfg.JSON {
				if err := writeJSONLine(cfg.Out, rows); err != nil {
					return err
				}
				continue
			}
			if args.Clear {
				fmt.Fprint(cfg.Out, "\033[H\033[2J")
			}
			fmt.Fprintf(cfg.Out, "%s  %s  every %s\n", cfg.Addr, now.UTC().Format(time.RFC3339), args.Interval)
			if err := RenderTop(cfg.Out, rows); err != nil {
				return err
			}
		}
		return nil
	})
}

// hint says what to do about a refused or failed call, by its code.
func hint(c codes.Code) string {
	switch c {
	case codes.Unavailable:
		return "the server cannot be reached: check --addr, that kvindex serve runs, and --tls for a TLS server"
	case codes.Unauthenticated:
		return "the server wants a token: give --token-file or $KVINDEX_TOKEN (or a client certificate)"
	case codes.PermissionDenied:
		return "the token lacks the scope this call needs (read, or route for Route/Release)"
	case codes.ResourceExhausted:
		return "the server is at a limit (overloaded, or too many watches): retry later"
	case codes.DeadlineExceeded:
		return "no answer in time: raise --timeout"
	}
	return ""
}

// statusOf returns err's gRPC status, looking through wrapping.
func statusOf(err error) *status.Status {
	if st, ok := api.ServerStatus(err); ok {
		return st
	}
	return status.Convert(err)
}
