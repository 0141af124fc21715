package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/router"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// AnalyzeConfig is one "should I deploy this?" run over a user's request
// log (`kvsim analyze`).
type AnalyzeConfig struct {
	// Log is the request log's path.
	Log string
	// TokenizeURL is a vLLM /tokenize endpoint for OpenAI bodies; "" uses
	// workload.EstimateTokens.
	TokenizeURL string
	// Window is how far back a reused prefix may have been seen for the
	// reuse ceiling (default 10 minutes).
	Window time.Duration
	// Sizes are the cache sizes replayed, blocks per engine (default
	// 25,000, 12,500, 6,250 and 3,125: shrinking caches).
	Sizes []int
	// Options configure the fleet; its Routers are ignored (round-robin,
	// precise and precise+load are replayed).
	Options Options
}

// Reuse is a log's reuse ceiling: the prompt tokens that are a prefix of
// an earlier request's prompt, in whole blocks, as an infinite cache would
// hit them.
type Reuse struct {
	// PromptTokens is every prompt token of the log.
	PromptTokens int64
	// Window is the tokens whose prefix was seen within the window;
	// Ever, at any earlier time.
	Window, Ever int64
}

// ReuseCeiling walks w in arrival order and counts, for each prompt, its
// longest prefix of full blockSize-token blocks that an earlier prompt
// held (within window for Reuse.Window). Cost: O(blocks), one map entry
// per distinct block prefix.
func ReuseCeiling(w *workload.Workload, blockSize int, window time.Duration) Reuse {
	var r Reuse
	last := make(map[uint64]time.Duration)
	var content []uint64
	for i := range w.Requests {
		req := &w.Requests[i]
		r.PromptTokens += int64(req.PromptLen)
		content = req.AppendBlockContent(content[:0], blockSize, workload.Segment{})
		h := uint64(0x7265757365) // "reuse"
		inWindow, ever := true, true
		for _, c := range content {
			h = workload.Mix64(h ^ c)
			at, seen := last[h]
			ever = ever && seen
			inWindow = inWindow && seen && req.Arrival-at <= window
			if ever {
				r.Ever += int64(blockSize)
			}
			if inWindow {
				r.Window += int64(blockSize)
			}
			last[h] = req.Arrival
		}
	}
	return r
}

// LoadRequestLog reads a request log: Mooncake JSONL (hash_ids), JSONL of
// token ids (token_ids) or OpenAI request bodies (prompt or messages),
// told from the first line's fields.
func LoadRequestLog(path, tokenizeURL string) (*workload.Workload, error) {
	format, err := sniffFormat(path)
	if err != nil {
		return nil, fmt.Errorf("sim: request log %s: %w", path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sim: request log: %w", err)
	}
	defer f.Close()
	name := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	switch format {
	case "hash_ids":
		return workload.ReadMooncake(f, name)
	case "token_ids":
		return workload.ReadTokenLog(f, name)
	default:
		tok := workload.EstimateTokens
		if tokenizeURL != "" {
			tok = VLLMTokenizer(tokenizeURL, &http.Client{Timeout: 30 * time.Second})
		}
		return workload.ReadOpenAILog(f, name, tok)
	}
}

// sniffFormat returns the field of its first non-empty line that tells a
// log's format: hash_ids, token_ids, or prompt (prompt or messages).
func sniffFormat(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b, &fields); err != nil {
			return "", fmt.Errorf("the first line is not a JSON object: %w", err)
		}
		for _, k := range []string{"hash_ids", "token_ids", "prompt", "messages"} {
			if fields[k] != nil {
				return k, nil
			}
		}
		return "", fmt.Errorf("the first line has none of hash_ids, token_ids, prompt or messages")
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("empty")
}

// VLLMTokenizer tokenizes OpenAI request bodies with a vLLM /tokenize
// endpoint (url, e.g. http://vllm:8000/tokenize): the body's model and
// prompt or messages are posted, the answer's tokens returned.
func VLLMTokenizer(url string, c *http.Client) workload.Tokenizer {
	return func(body json.RawMessage) ([]uint32, error) {
		var in map[string]json.RawMessage
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, fmt.Errorf("request body: %w", err)
		}
		out := map[string]json.RawMessage{}
		for _, k := range []string{"model", "prompt", "messages"} {
			if v, ok := in[k]; ok {
				out[k] = v
			}
		}
		req, err := json.Marshal(out)
		if err != nil {
			return nil, err
		}
		resp, err := c.Post(url, "application/json", bytes.NewReader(req))
		if err != nil {
			return nil, fmt.Errorf("POST %s: %w", url, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		if err != nil {
			return nil, fmt.Errorf("POST %s: %w", url, err)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("POST %s: %s: %.200s", url, resp.Status, b)
		}
		var t struct {
			Tokens []uint32 `json:"tokens"`
		}
		if err := json.Unmarshal(b, &t); err != nil {
			return nil, fmt.Errorf("POST %s: answer: %w (starts %.80q)", url, err, b)
		}
		return t.Tokens, nil
	}
}

// Analyze reads ac's log, prints its reuse ceiling, replays it through
// round-robin, precise and precise+load at each cache size, and ends with
// a one-line verdict (see Verdict).
func Analyze(ctx context.Context, ac AnalyzeConfig, w io.Writer) error {
	if ac.Window <= 0 {
		ac.Window = 10 * time.Minute
	}
	if len(ac.Sizes) == 0 {
		ac.Sizes = []int{25000, 12500, 6250, 3125}
	}
	wl, err := LoadRequestLog(ac.Log, ac.TokenizeURL)
	if err != nil {
		return err
	}
	o := ac.Options
	o.Routers = []string{router.RoundRobin, router.Precise, router.PreciseLoad}
	od, err := o.withDefaults(wl.Engines)
	if err != nil {
		return err
	}
	reuse := ReuseCeiling(wl, od.Engine.BlockSize, ac.Window)
	st := wl.Stats()
	fmt.Fprintf(w, "kvsim analyze: %s: %d requests, %s prompt tokens over %s\n\n", wl.Name, st.Requests, human(float64(st.PromptTokens)), st.Duration.Round(time.Second))
	fmt.Fprintf(w, "Reuse ceiling (prompt tokens that are a prefix of an earlier prompt, %d-token blocks, infinite cache):\n", od.Engine.BlockSize)
	fmt.Fprintf(w, "  within %v: %s    at any time: %s\n\n", ac.Window, pct(ratio(reuse.Window, reuse.PromptTokens)), pct(ratio(reuse.Ever, reuse.PromptTokens)))
	points, err := Sweep(ctx, wl, o, ac.Sizes)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Replayed on %d engines (blocks of %d tokens per engine):\n", od.Engines, od.Engine.BlockSize)
	if err := WriteSweepTable(w, points); err != nil {
		return err
	}
	fmt.Fprintln(w, "\np99 TTFT:")
	if err := writeSweepGrid(w, points, func(_ *SweepPoint, r *metrics.Result) string { return secs(r.TTFTP99) }, nil); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nverdict: %s\n", Verdict(reuse, ac.Window, points))
	return nil
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Verdict is the one-line answer to "does cache-aware routing pay on this
// traffic?":
//
//   - "no" when under 5% of prompt tokens repeat an earlier prefix within
//     the window: no router can cache more than that;
//   - "yes" when, at some replayed cache size, precise+load caches at
//     least 5 points more of the prompt tokens than round-robin or has a
//     p99 TTFT at least 10% lower, without a p99 more than 10% higher;
//   - "marginal" otherwise.
func Verdict(reuse Reuse, window time.Duration, points []SweepPoint) string {
	ceiling := ratio(reuse.Window, reuse.PromptTokens)
	if ceiling < 0.05 {
		return fmt.Sprintf("no: only %s of prompt tokens repeat an earlier prompt's prefix within %v; no router can cache more, so cache-aware routing has little to win here", pct(ceiling), window)
	}
	var best *SweepPoint
	bestGain := 0.0
	for pi := range points {
		p := &points[pi]
		rr, pl := find(p.Results, router.RoundRobin), find(p.Results, router.PreciseLoad)
		if rr == nil || pl == nil {
			continue
		}
		gain := pl.TokenHitRate() - rr.TokenHitRate()
		p99 := float64(pl.TTFTP99) / max(float64(rr.TTFTP99), 1)
		if (gain >= 0.05 || p99 <= 0.9) && p99 <= 1.1 && (best == nil || gain > bestGain) {
			best, bestGain = p, gain
		}
	}
	if best == nil {
		return fmt.Sprintf("marginal: %s of prompt tokens repeat within %v, but precise+load neither caches 5 points more than round-robin nor cuts p99 TTFT by 10%% at any replayed cache size", pct(ceiling), window)
	}
	rr, pl := find(best.Results, router.RoundRobin), find(best.Results, router.PreciseLoad)
	return fmt.Sprintf("yes: at %d blocks per engine precise+load caches %s of prompt tokens (round-robin %s, ceiling %s within %v) with p99 TTFT %s (round-robin %s)",
		best.CacheBlocks, pct(pl.TokenHitRate()), pct(rr.TokenHitRate()), pct(ceiling), window, secs(pl.TTFTP99), secs(rr.TTFTP99))
}

func find(rs []metrics.Result, name string) *metrics.Result {
	for i := range rs {
		if rs[i].Router == name {
			return &rs[i]
		}
	}
	return nil
}

// ParseSizes parses a comma-separated list of cache sizes in blocks; a
// size may end in k (thousands).
func ParseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ToLower(f))
		if f == "" {
			continue
		}
		mult := 1
		if strings.HasSuffix(f, "k") {
			mult, f = 1000, strings.TrimSuffix(f, "k")
		}
		n, err := strconv.ParseFloat(f, 64)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("sim: cache size %q: want a positive number of blocks", f)
		}
		out = append(out, int(n*float64(mult)))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sim: no cache sizes in %q", s)
	}
	return out, nil
}
