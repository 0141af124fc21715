package indexer

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvindex/kvindex/events"
)

// Reason is one reason Diagnose finds for a worker missing a prompt's
// block. kvindex.v1's DiagnoseReason mirrors it.
type Reason uint8

// Reasons, the most specific first.
const (
	ReasonHit              Reason = iota + 1 // the worker holds every block.
	ReasonModelDiffers                       // the worker serves another model.
	ReasonLoRADiffers                        // the worker holds the tokens under another adapter.
	ReasonUnknownLoRA                        // the worker never stored under the request's adapter.
	ReasonSaltDiffers                        // the worker holds the tokens with another salt.
	ReasonExtraKeysDiffer                    // the worker holds the tokens with other extra keys.
	ReasonBlockSize                          // the worker's events carry another block size.
	ReasonStale                              // the worker's stream is stale.
	ReasonUnsynced                           // the worker lost events beyond replay.
	ReasonUnhealthy                          // recovering, in conflict or degraded.
	ReasonReset                              // the worker was reset or cleared.
	ReasonRemoved                            // the engine removed the block.
	ReasonEvicted                            // the index evicted the block.
	ReasonNotStored                          // no record of the block: never stored, or removed before the record.
	ReasonOrphans                            // the worker stored blocks under unknown parents.
	ReasonTooShort                           // the prompt has no full block.
	ReasonHeldElsewhere                      // other workers hold the block.
	ReasonGroupCap                           // a KV-cache group caps the hit vLLM realizes below the prefix held.
	ReasonGroupNotModelled                   // the worker has a KV-cache group whose hit rule kvindex does not model.
)

// Verdict is the outcome of a parity check (see Parity).
type Verdict uint8

// Verdicts.
const (
	VerdictAgree         Verdict = iota + 1 // every engine block the worker holds sits at the prompt's key.
	VerdictBlockSize                        // the engine's block count implies another block size.
	VerdictTokens                           // an engine block holds other tokens.
	VerdictKeying                           // an engine block holds the tokens under other keying inputs.
	VerdictUnknownHashes                    // the worker holds none of the engine's hashes.
	VerdictKeyedWorker                      // the worker is a replica and knows no engine hashes.
)

// DiagnoseQuery is a prompt, the worker expected to hold it, and what the
// caller knows of the worker's stream.
type DiagnoseQuery struct {
	// Model is the request's model; Worker the worker diagnosed (of any
	// model).
	Model  *Model
	Worker *Worker
	// Tokens (with Extras, which may be nil) or Keys give the prompt;
	// keying variants are tried only with Tokens.
	Tokens []uint32
	Extras *PromptExtras
	Keys   []Key
	// EngineHashes, when given, are the engine's block hashes for the
	// prompt, one per full block: Diagnose then checks parity.
	EngineHashes []uint64
	// Health and HealthReason are the worker's stream health.
	Health       events.Health
	HealthReason string
}

// Finding is one reason, a sentence explaining it, and the time of the
// removal or reset it is about.
type Finding struct {
	Reason Reason
	Detail string
	At     time.Time
}

// Parity compares an engine's block hashes for a prompt with kvindex's
// keys.
type Parity struct {
	Verdict Verdict
	Detail  string
	// Engine is the number of hashes given, Known how many the worker
	// holds, Agreed how many of those sit at the prompt's key.
	Engine, Known, Agreed int
	First                 int // the first block that disagrees (VerdictTokens, VerdictKeying).
}

// Diagnosis is Diagnose's answer.
type Diagnosis struct {
	// Blocks is the prompt's full blocks; Matched the worker's consecutive
	// prefix of them; FirstMiss the key of block Matched (0 on a hit).
	Blocks, Matched int
	FirstMiss       Key
	Findings        []Finding // the reasons found, the most likely first.
	History         int       // the number of removals the worker's record holds.
	Parity          *Parity   // set when the query gave engine hashes.
}

// variant is the prompt keyed with one keying input changed.
type variant struct {
	reason Reason
	what   string // "LoRA adapter \"x\"", as the engine would have keyed it
	keys   []Key
}

// variants returns the prompt keyed with each alternative the index can
// name: another adapter (none, or one the worker stored under), no salt,
// no explicit extra keys.
func variants(m *Model, w *Worker, tokens []uint32, ex *PromptExtras) []variant {
	var base PromptExtras
	if ex != nil {
		base = *ex
	}
	var out []variant
	add := func(r Reason, what string, px PromptExtras) {
		out = append(out, variant{reason: r, what: what, keys: m.PromptKeys(tokens, &px, nil)})
	}
	if base.LoRAName != "" {
		px := base
		px.LoRAName = ""
		add(ReasonLoRADiffers, "no LoRA adapter (the base model)", px)
	}
	loras, _ := w.LoRAs()
	for _, l := range loras {
		if l != base.LoRAName {
			px := base
			px.LoRAName = l
			add(ReasonLoRADiffers, fmt.Sprintf("LoRA adapter %q", l), px)
		}
	}
	if base.CacheSalt != "" && base.BlockExtras == nil {
		px := base
		px.CacheSalt = ""
		add(ReasonSaltDiffers, "no cache_salt", px)
	}
	if base.BlockExtras != nil {
		px := base
		px.BlockExtras = nil
		add(ReasonExtraKeysDiffer, "the extra keys derived from lora_name and cache_salt alone (not the request's block_extra_keys)", px)
	}
	return out
}

// matchOf returns w's consecutive prefix of keys.
func (ix *Index) matchOf(keys []Key, w *Worker) int {
	var dst [1]Match
	ms := ix.Match(keys, func(id WorkerID) bool { return id == w.id }, dst[:0])
	if len(ms) == 0 {
		return 0
	}
	return ms[0].Blocks
}

// Diagnose explains why q.Worker does not hold q's prompt: the first block
// it misses and every reason the index can find, the most likely first,
// and, given engine hashes, whether kvindex and the engine key the prompt
// alike. Removals older than the worker's record read as ReasonNotStored.
// Cost: a Match per keying variant (at most 19), a scan of the removal
// record and a Lookup.
func (ix *Index) Diagnose(q *DiagnoseQuery) *Diagnosis {
	w, m := q.Worker, q.Model
	keys := q.Keys
	if keys == nil {
		keys = m.PromptKeys(q.Tokens, q.Extras, nil)
	}
	d := &Diagnosis{Blocks: len(keys)}
	var vars []variant
	if len(q.Tokens) > 0 {
		vars = variants(m, w, q.Tokens, q.Extras)
	}
	if len(q.EngineHashes) > 0 {
		d.Parity = ix.parity(q, keys, vars)
	}
	st := w.Stats()
	if len(keys) == 0 {
		d.add(ReasonTooShort, time.Time{}, "the prompt's %d tokens make no full block of %d", len(q.Tokens), m.BlockSize())
		return d
	}
	d.Matched = ix.matchOf(keys, w)
	capped := groupFindings(d, q, keys, w)
	if d.Matched == len(keys) && !capped {
		d.add(ReasonHit, time.Time{}, "the worker holds all %d blocks of the prompt", len(keys))
		d.health(q)
		return d
	}
	if d.Matched == len(keys) {
		d.health(q)
		return d
	}
	d.FirstMiss = keys[d.Matched]
	explained := ix.explainMiss(d, q, vars)
	if w.BlockSizeMismatch() {
		d.add(ReasonBlockSize, time.Time{}, "the worker's engine keys %d-token blocks, the model's prompts %d-token ones (%s): no prompt can match its blocks until they agree", st.BlockSize, w.model.BlockSize(), describeSizes(w.model))
	}
	d.health(q)
	if q.Extras != nil && q.Extras.LoRAName != "" && !w.info.Keyed {
		loras, over := w.LoRAs()
		if !over && !slices.Contains(loras, q.Extras.LoRAName) {
			d.add(ReasonUnknownLoRA, time.Time{}, "the worker never stored a block under LoRA adapter %q (it stored under: %s)", q.Extras.LoRAName, orNone(strings.Join(loras, ", ")))
		}
	}
	if !explained {
		at, what := st.LastResetAt, "reset ("+orNone(st.LastReset)+")"
		if st.LastClearAt.After(at) {
			at, what = st.LastClearAt, "cleared (AllBlocksCleared)"
		}
		if !at.IsZero() {
			d.add(ReasonReset, at, "the worker was last %s at %s: blocks stored before then are gone", what, at.UTC().Format(time.RFC3339Nano))
		}
		if st.Orphans > 0 {
			d.add(ReasonOrphans, time.Time{}, "%d of the worker's blocks were stored under parents it never announced (lost events) and match no prompt", st.Orphans)
		}
		d.add(ReasonNotStored, time.Time{}, "the worker does not hold block %d and none of its last %d removals is of it: never stored, or removed before the record", d.Matched, d.History)
	}
	ix.heldElsewhere(d, keys, w)
	return d
}

// groupFindings adds what the worker's KV-cache groups say of its hit: a
// side group capping it below the d.Matched blocks its prefix group holds
// (the rule applied where vLLM applies it, one token short of a tokens
// prompt), and groups kvindex does not model. It reports whether a group
// capped the hit.
func groupFindings(d *Diagnosis, q *DiagnoseQuery, keys []Key, w *Worker) bool {
	for _, g := range w.Groups() {
		if g.Class == ClassOther {
			d.add(ReasonGroupNotModelled, time.Time{}, "%s: kvindex does not model its hit rule (its events are counted, not tracked), so vLLM may realize less than the prefix held", g.describe())
		}
	}
	if d.Matched == 0 || !w.HasSideGroups() {
		return false
	}
	bs := q.Model.BlockSize()
	maxTokens := len(keys) * bs
	if len(q.Tokens) > 0 {
		maxTokens = len(q.Tokens) - 1
	}
	at := func(size int) []Key {
		switch {
		case size == bs:
			return keys
		case len(q.Tokens) > 0:
			return PromptKeys(q.Model.Name, size, q.Tokens, q.Extras, nil)
		}
		return nil
	}
	t, by := w.Cap(d.Matched*bs, maxTokens, at)
	if by < 0 || t/bs >= d.Matched {
		return false
	}
	g, _ := w.Group(by)
	rule := "every block from the first"
	switch g.Class {
	case ClassWindow:
		rule = fmt.Sprintf("the %d blocks before the cut (its window)", g.windowBlocks())
	case ClassMamba:
		rule = "the state at the cut"
	}
	d.add(ReasonGroupCap, time.Time{}, "the prefix group holds %d blocks, but %s, which needs %s, can serve no longer a hit than %d: vLLM realizes %d blocks", d.Matched, g.describe(), rule, t/bs, t/bs)
	return true
}

func (d *Diagnosis) add(r Reason, at time.Time, format string, args ...any) {
	d.Findings = append(d.Findings, Finding{Reason: r, Detail: fmt.Sprintf(format, args...), At: at})
}

// health adds the finding the worker's stream health makes, if any.
func (d *Diagnosis) health(q *DiagnoseQuery) {
	switch h := q.Health; h {
	case events.HealthOK, events.HealthUnknown:
	case events.HealthStale:
		d.add(ReasonStale, time.Time{}, "the worker's stream is stale (%s): what it holds now is unknown, and answers leave it out", orNone(q.HealthReason))
	case events.HealthUnsynced:
		d.add(ReasonUnsynced, time.Time{}, "the worker lost events beyond replay (%s): the index may be wrong either way until its next clear or restart", orNone(q.HealthReason))
	default:
		d.add(ReasonUnhealthy, time.Time{}, "the worker is %s (%s)", h, orNone(q.HealthReason))
	}
}

// explainMiss adds the findings that explain the miss (another model or
// keying, a removal on record), reports whether there were any, and sets
// d.History.
func (ix *Index) explainMiss(d *Diagnosis, q *DiagnoseQuery, vars []variant) bool {
	w, m := q.Worker, q.Model
	explained := false
	if w.model != m {
		d.add(ReasonModelDiffers, time.Time{}, "the worker serves model %q (block size %d), not %q", w.model.Name, w.model.BlockSize(), m.Name)
		if len(q.Tokens) > 0 {
			if n := ix.matchOf(w.model.PromptKeys(q.Tokens, q.Extras, nil), w); n > d.Matched {
				d.Findings[len(d.Findings)-1].Detail += fmt.Sprintf("; keyed as %q, it holds %d blocks of the prompt", w.model.Name, n)
			}
		}
		explained = true
	}
	for _, v := range vars {
		if n := ix.matchOf(v.keys, w); n > d.Matched {
			d.add(v.reason, time.Time{}, "the worker holds %d blocks of the prompt keyed with %s, against %d as requested", n, v.what, d.Matched)
			explained = true
		}
	}
	r, hist, removed := w.FindRemoval(d.FirstMiss)
	d.History = hist
	if removed {
		reason := ReasonRemoved
		if r.Cause != CauseRemoved {
			reason = ReasonEvicted
		}
		d.add(reason, r.At, "block %d was %s at %s", d.Matched, r.Cause, r.At.UTC().Format(time.RFC3339Nano))
		explained = true
	}
	return explained
}

// heldElsewhere adds which other workers hold block d.Matched, if any.
func (ix *Index) heldElsewhere(d *Diagnosis, keys []Key, w *Worker) {
	var elsewhere []string
	n := 0
	ix.Lookup(keys[:d.Matched+1], func(from, to int, held []Holder) bool {
		if to <= d.Matched {
			return true
		}
		for _, h := range held {
			if h.Worker == w.id {
				continue
			}
			if o := ix.Worker(h.Worker); o != nil {
				n++
				if len(elsewhere) < 3 {
					elsewhere = append(elsewhere, o.info.Ref.String())
				}
			}
		}
		return false
	})
	if n > 0 {
		more := ""
		if n > len(elsewhere) {
			more = fmt.Sprintf(" and %d more", n-len(elsewhere))
		}
		d.add(ReasonHeldElsewhere, time.Time{}, "block %d is held by %s%s", d.Matched, strings.Join(elsewhere, ", "), more)
	}
}

// parity compares q's engine hashes with keys.
func (ix *Index) parity(q *DiagnoseQuery, keys []Key, vars []variant) *Parity {
	w := q.Worker
	p := &Parity{Engine: len(q.EngineHashes), First: -1}
	if w.info.Keyed {
		p.Verdict = VerdictKeyedWorker
		p.Detail = fmt.Sprintf("worker %s is a fleet replica: it knows content keys, not engine hashes; run the check against its agent", w.info.Ref)
		return p
	}
	if t := len(q.Tokens); t > 0 && p.Engine != len(keys) {
		lo, hi := t/(p.Engine+1)+1, t/p.Engine
		p.Verdict = VerdictBlockSize
		p.Detail = fmt.Sprintf("the engine gave %d block hashes for %d tokens, %d to %d tokens a block; kvindex keys %d-token blocks (%d blocks): the engine's block size is not the one its events announce", p.Engine, t, lo, hi, q.Model.BlockSize(), len(keys))
		return p
	}
	ebs, _ := w.EngineBlocks(q.EngineHashes, nil)
	for i, eb := range ebs {
		if !eb.Found {
			continue
		}
		p.Known++
		if i < len(keys) && eb.Key == keys[i] {
			p.Agreed++
		} else if p.First < 0 {
			p.First = i
		}
	}
	switch {
	case p.Known == 0:
		p.Verdict = VerdictUnknownHashes
		p.Detail = fmt.Sprintf("the worker holds none of the %d engine hashes: never stored, removed, or not the hashes its events carry", p.Engine)
		if n := w.c.blockSize.Load(); n > 0 {
			p.Detail += fmt.Sprintf(" (%d of its events had block_size %d, not the model's)", n, w.c.lastBadBlockSize.Load())
		}
	case p.First < 0:
		p.Verdict = VerdictAgree
		p.Detail = fmt.Sprintf("all %d engine blocks the worker holds (of %d) sit at kvindex's keys for the prompt", p.Known, p.Engine)
	default:
		i := p.First
		eb := ebs[i]
		for _, v := range vars {
			if i < len(v.keys) && v.keys[i] == eb.Key {
				p.Verdict = VerdictKeying
				p.Detail = fmt.Sprintf("from block %d the engine keyed the prompt with %s", i, v.what)
				return p
			}
		}
		parentAgrees := i == 0 && !eb.HasParent || i > 0 && eb.HasParent && eb.Parent == keys[i-1]
		p.Verdict = VerdictTokens
		switch {
		case parentAgrees && i == 0:
			p.Detail = "block 0 of the engine holds other tokens than the prompt's first block (or is keyed under another model name or adapter): the router's tokens (tokenizer, chat template) differ from the engine's"
		case parentAgrees:
			p.Detail = fmt.Sprintf("block %d of the engine follows the prompt's block %d but holds other tokens: the router's tokens differ from the engine's from token %d", i, i-1, i*q.Model.BlockSize())
		case i == 0:
			p.Detail = "the engine's block for the prompt's first block has a parent: the engine's prompt starts earlier (a system prompt or BOS token the router's tokens lack)"
		default:
			p.Verdict = VerdictKeying
			p.Detail = fmt.Sprintf("block %d of the engine sits under another parent than the prompt's block %d: their chains differ (an earlier block's extra keys, or blocks stored out of order)", i, i-1)
		}
	}
	return p
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
