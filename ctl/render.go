package ctl

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// WriteJSON prints msg as indented protojson, zero fields included so that
// scripts see every field.
func WriteJSON(w io.Writer, msg proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: true}.Marshal(msg)
	if err != nil {
		return fmt.Errorf("render %s as JSON: %w", msg.ProtoReflect().Descriptor().FullName(), err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// WorkerName renders a worker as "pod/rank".
func WorkerName(r *kvindexv1.WorkerRef) string {
	return r.GetPod() + "/" + strconv.FormatUint(uint64(r.GetDpRank()), 10)
}

// RenderWorkers prints one row per worker (LAST EVENT as an age relative
// to now; DIGEST of the resident set, equal on every replica that holds
// the same), then notes on anything that makes its answers less than
// exact.
func RenderWorkers(w io.Writer, resp *kvindexv1.ListWorkersResponse, now time.Time) error {
	if len(resp.GetWorkers()) == 0 {
		_, err := fmt.Fprintln(w, "no workers")
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "WORKER\tMODEL\tENDPOINT\tHEALTH\tSEQ\tLAST EVENT\tRESIDENT\tGAPS\tREPLAYS\tRESTARTS\tCLEARS\tERRORS\tORPHANS\tDIGEST")
	var notes []string
	for _, ws := range resp.GetWorkers() {
		seq := "-"
		if ws.GetHasSeq() {
			seq = strconv.FormatUint(ws.GetLastSeq(), 10)
		}
		last := "never"
		if ws.GetLastEventTime() != nil {
			last = Age(now.Sub(ws.GetLastEventTime().AsTime()))
		}
		digest := "-"
		if ws.GetHasDigest() {
			digest = fmt.Sprintf("%016x", ws.GetDigest())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n",
			WorkerName(ws.GetWorker()), orDash(ws.GetModel()), orDash(ws.GetEndpoint()), health(ws, now), seq, last,
			resident(ws), gaps(ws), replays(ws), ws.GetRestarts(), ws.GetClears(), ws.GetDecodeErrors()+ws.GetApplyErrors(), ws.GetOrphans(), digest)
		note := func(when bool, format string, args ...any) {
			if when {
				notes = append(notes, WorkerName(ws.GetWorker())+": "+fmt.Sprintf(format, args...))
			}
		}
		note(ws.GetHealthReason() != "", "%s: %s", health(ws, now), ws.GetHealthReason())
		note(ws.GetDuplicates() > 0, "%d duplicate messages dropped", ws.GetDuplicates())
		note(ws.GetJoinedAtSeq() > 0, "joined late at seq %d: blocks stored before it are unknown", ws.GetJoinedAtSeq())
		note(ws.GetDropped() > 0, "%d messages dropped on a full queue (backlog now %d)", ws.GetDropped(), ws.GetBacklog())
		note(ws.GetEvictions() > 0, "%d blocks evicted beyond its capacity of %d (removals were lost)", ws.GetEvictions(), ws.GetCapacity())
		note(ws.GetBudgetEvictions() > 0, "%d blocks evicted for kvindex's memory budget", ws.GetBudgetEvictions())
		note(ws.GetBlockSize() != 0 && ws.GetBlockSize() != ws.GetModelBlockSize(),
			"its engine announces %d-token blocks, its model keys prompts at %d: no prompt matches its blocks (%d events)", ws.GetBlockSize(), ws.GetModelBlockSize(), ws.GetBlockSizeMismatches())
		note(len(ws.GetGroups()) > 1 || len(ws.GetGroups()) == 1 && ws.GetGroups()[0].GetKind() != "" && ws.GetGroups()[0].GetKind() != "full_attention",
			"KV-cache groups: %s", groups(ws.GetGroups()))
		note(ws.GetUnknownGroupBlocks() > 0, "%d blocks removed from KV-cache groups never stored (nothing touched)", ws.GetUnknownGroupBlocks())
		note(ws.GetLayoutChanges() > 0, "%d stores refused for describing a KV-cache group anew while it held blocks", ws.GetLayoutChanges())
		note(ws.GetSideRefused() > 0, "%d blocks of capping groups refused beyond their bound (hits may be under-credited)", ws.GetSideRefused())
		note(ws.GetUnknownBlocks() > 0, "%d removals or offloads of blocks it never stored", ws.GetUnknownBlocks())
		note(ws.GetUnknownEvents() > 0, "%d events of an unknown type skipped (last %q); the rest of their batches applied",
			ws.GetUnknownEvents(), ws.GetLastUnknownEvent())
		note(ws.GetUnknownMediumEvents() > 0, "%d events name media kvindex does not know (%s): held as scoring.unknown_tier; map them with scoring.tier_names",
			ws.GetUnknownMediumEvents(), strings.Join(ws.GetUnknownMedia(), ", "))
		note(ws.GetLastError() != "", "last error: %s", ws.GetLastError())
		note(ws.GetLastReset() != "", "last reset: %s", ws.GetLastReset())
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write workers table: %w", err)
	}
	for _, n := range notes {
		if _, err := fmt.Fprintln(w, n); err != nil {
			return fmt.Errorf("write workers notes: %w", err)
		}
	}
	return nil
}

// groups renders a worker's KV-cache groups: "0 full_attention 16 (prefix,
// 1200 blocks), 1 sliding_window/128 16 (cap, 300 blocks)".
func groups(gs []*kvindexv1.KVCacheGroup) string {
	parts := make([]string, len(gs))
	for i, g := range gs {
		kind := orDash(g.GetKind())
		if w := g.GetSlidingWindow(); w > 0 {
			kind += fmt.Sprintf("/%d", w)
		}
		parts[i] = fmt.Sprintf("%d %s %d (%s, %d blocks)", g.GetIndex(), kind, g.GetBlockSize(), g.GetRole(), g.GetResidentBlocks())
	}
	return strings.Join(parts, ", ")
}

// capNote says why a worker's match is below its prefix group's: "group 1
// (sliding_window, window 128) caps the prefix's 12 blocks at 8".
func capNote(s *kvindexv1.WorkerScore) string {
	g := s.GetCappedBy()
	what := "a KV-cache group"
	if g != nil {
		what = fmt.Sprintf("group %d (%s", g.GetIndex(), orDash(g.GetKind()))
		if w := g.GetSlidingWindow(); w > 0 {
			what += fmt.Sprintf(", window %d", w)
		}
		what += ")"
	}
	return fmt.Sprintf("%s caps the prefix group's %d blocks at %d, the hit vLLM realizes", what, s.GetPrefixBlocks(), s.GetMatchedBlocks()-s.GetSpeculativeBlocks())
}

// health renders the worker's health, with the age of a stale state.
func health(ws *kvindexv1.WorkerStatus, now time.Time) string {
	h := strings.TrimPrefix(ws.GetHealth().String(), "WORKER_HEALTH_")
	switch {
	case h == "UNSPECIFIED":
		return "UNKNOWN"
	case h == "STALE" && ws.GetStaleSince() != nil:
		return "STALE " + strings.TrimSuffix(Age(now.Sub(ws.GetStaleSince().AsTime())), " ago")
	}
	return h
}

// gaps renders seq gaps, with how many replay could not fill: "3 (1 lost)".
func gaps(ws *kvindexv1.WorkerStatus) string {
	g := strconv.FormatUint(ws.GetGaps(), 10)
	if n := ws.GetUnrecoveredGaps(); n > 0 {
		g += " (" + strconv.FormatUint(n, 10) + " lost)"
	}
	return g
}

// replays renders replay requests with the batches they applied and their
// failures: "2/14" or "3/14 (1 failed)"; "-" without a replay endpoint.
func replays(ws *kvindexv1.WorkerStatus) string {
	if ws.GetReplayEndpoint() == "" && ws.GetReplays() == 0 {
		return "-"
	}
	r := strconv.FormatUint(ws.GetReplays(), 10) + "/" + strconv.FormatUint(ws.GetReplayedBatches(), 10)
	var notes []string
	if n := ws.GetReplayFailures(); n > 0 {
		notes = append(notes, strconv.FormatUint(n, 10)+" failed")
	}
	if n := ws.GetStaleReplays(); n > 0 {
		notes = append(notes, strconv.FormatUint(n, 10)+" answered too late")
	}
	if len(notes) > 0 {
		r += " (" + strings.Join(notes, ", ") + ")"
	}
	return r
}

// resident renders resident blocks, split by medium when more than GPU
// holds them: "120 (GPU 100, CPU 40)".
func resident(ws *kvindexv1.WorkerStatus) string {
	total := strconv.FormatUint(ws.GetResidentBlocks(), 10)
	media := ws.GetResidentByMedium()
	if len(media) == 0 || (len(media) == 1 && media[0].GetMedium() == "GPU") {
		return total
	}
	parts := make([]string, len(media))
	for i, m := range media {
		parts[i] = m.GetMedium() + " " + strconv.FormatUint(m.GetBlocks(), 10)
	}
	return total + " (" + strings.Join(parts, ", ") + ")"
}

// RenderScore prints a Score answer: the model, block size and prompt
// blocks, then one row per worker: WORKER, MATCHED BLOCKS, MATCHED TOKENS,
// % OF PROMPT and BY MEDIUM ("GPU 12, CPU 20").
func RenderScore(w io.Writer, req *kvindexv1.ScoreRequest, resp *kvindexv1.ScoreResponse) error {
	tw := newTable(w)
	fmt.Fprintf(tw, "model:\t%s\n", req.GetModel())
	if l := req.GetLoraName(); l != "" {
		fmt.Fprintf(tw, "lora:\t%s\n", l)
	}
	fmt.Fprintf(tw, "block size:\t%d tokens\n", resp.GetBlockSize())
	blocks := fmt.Sprint(resp.GetPromptBlocks())
	if n := len(req.GetTokenIds()); n > 0 {
		blocks += fmt.Sprintf(" (%d of %d tokens in full blocks)", uint64(resp.GetPromptBlocks())*uint64(resp.GetBlockSize()), n)
	}
	fmt.Fprintf(tw, "prompt blocks:\t%s\n", blocks)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write score header: %w", err)
	}
	if len(resp.GetWorkers()) == 0 {
		_, err := fmt.Fprintln(w, "\nno worker holds the first block of this prompt")
		return err
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "WORKER\tMATCHED BLOCKS\tMATCHED TOKENS\t% OF PROMPT\tBY MEDIUM")
	for _, s := range resp.GetWorkers() {
		pct := "-"
		if pb := resp.GetPromptBlocks(); pb > 0 {
			pct = fmt.Sprintf("%.1f%%", 100*float64(s.GetMatchedBlocks())/float64(pb))
		}
		media := make([]string, len(s.GetByMedium()))
		for i, m := range s.GetByMedium() {
			media[i] = fmt.Sprintf("%s %d", m.GetMedium(), m.GetBlocks())
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", WorkerName(s.GetWorker()), s.GetMatchedBlocks(), s.GetMatchedTokens(), pct, orDash(strings.Join(media, ", ")))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write score table: %w", err)
	}
	for _, s := range resp.GetWorkers() {
		if s.GetPrefixBlocks() > 0 {
			fmt.Fprintf(w, "%s: %s\n", WorkerName(s.GetWorker()), capNote(s))
		}
	}
	return nil
}

// RenderExplain prints a Score answer with the ranking breakdown: the
// RenderScore header, then per worker in rank order its match (with
// speculative blocks), weighted overlap, load and where it came from,
// penalty, final score and the server's one-line reason.
func RenderExplain(w io.Writer, req *kvindexv1.ScoreRequest, resp *kvindexv1.ScoreResponse) error {
	tw := newTable(w)
	fmt.Fprintf(tw, "model:\t%s\n", req.GetModel())
	fmt.Fprintf(tw, "policy:\t%s\n", resp.GetPolicy())
	fmt.Fprintf(tw, "prompt blocks:\t%d blocks of %d tokens\n", resp.GetPromptBlocks(), resp.GetBlockSize())
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write explain header: %w", err)
	}
	if len(resp.GetWorkers()) == 0 {
		_, err := fmt.Fprintln(w, "\nno worker to rank")
		return err
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "RANK\tWORKER\tHEALTH\tMATCHED\tOVERLAP\tRUNNING/WAITING\tIN FLIGHT\tQUEUED TOKENS\tPENALTY\tSCORE")
	for i, s := range resp.GetWorkers() {
		l := s.GetLoad()
		matched := strconv.FormatUint(uint64(s.GetMatchedBlocks()), 10)
		if n := s.GetPrefixBlocks(); n > 0 {
			matched += fmt.Sprintf(" of %d", n)
		}
		if n := s.GetSpeculativeBlocks(); n > 0 {
			matched += fmt.Sprintf(" (%d spec.)", n)
		}
		rw := "-"
		if l.GetSource() != "none" && l.GetSource() != "" {
			rw = fmt.Sprintf("%d/%d (%s)", l.GetRunning(), l.GetWaiting(), l.GetSource())
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.2f\t%s\t%d\t%d\t%.0f\t%.0f\n", i+1, WorkerName(s.GetWorker()),
			healthName(s.GetHealth()), matched, s.GetOverlap(), rw,
			l.GetInflightRequests(), l.GetQueuedPrefillTokens(), s.GetPenalty(), s.GetScore())
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write explain table: %w", err)
	}
	fmt.Fprintln(w)
	for _, s := range resp.GetWorkers() {
		if r := s.GetReason(); r != "" {
			fmt.Fprintf(w, "%s: %s\n", WorkerName(s.GetWorker()), r)
		}
		if s.GetPrefixBlocks() > 0 {
			fmt.Fprintf(w, "%s: %s\n", WorkerName(s.GetWorker()), capNote(s))
		}
	}
	return nil
}

// Age renders how long ago something happened, coarsely: "3s ago",
// "4m ago", "2h ago", "5d ago"; "just now" within a second either way and
// "in the future" beyond that (clock skew).
func Age(d time.Duration) string {
	switch {
	case d <= -time.Second:
		return "in the future"
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
