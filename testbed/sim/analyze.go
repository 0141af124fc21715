package sim

import (
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

// AnalyzeConfig is one `kvsim analyze` run over a user's request log.
type AnalyzeConfig struct {
	Log         string        // the request log's path
	TokenizeURL string        // a vLLM /tokenize endpoint for OpenAI bodies ("": workload.EstimateTokens)
	Window      time.Duration // how long ago a reused prefix may have been seen (default 10 minutes)
	Sizes       []int         // cache sizes replayed, blocks per engine (default 25k, 12.5k, 6,250, 3,125)
	// Options configure the fleet; round-robin, the peers (router.Peers),
	// precise and precise+load are replayed, whatever its Routers.
	Options Options
}

// Reuse is a log's reuse ceiling: of its PromptTokens, those in whole
// blocks that are a prefix of an earlier prompt seen within the window,
// and seen ever.
type Reuse struct {
	PromptTokens, Window, Ever int64
}

// ReuseCeiling walks w in arrival order counting each prompt's longest
// prefix of full blocks that an earlier prompt held. Cost: O(blocks), a
// map entry per distinct block prefix.
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

// LoadRequestLog reads a request log of Mooncake lines (hash_ids), token
// ids (token_ids) or OpenAI bodies (prompt or messages), as its first
// line says.
func LoadRequestLog(path, tokenizeURL string) (*workload.Workload, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sim: request log: %w", err)
	}
	format, err := sniffFormat(b)
	if err != nil {
		return nil, fmt.Errorf("sim: request log %s: %w", path, err)
	}
	name := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	switch format {
	case "hash_ids":
		return workload.ReadMooncake(bytes.NewReader(b), name)
	case "token_ids":
		return workload.ReadTokenLog(bytes.NewReader(b), name)
	}
	tok := workload.EstimateTokens
	if tokenizeURL != "" {
		tok = VLLMTokenizer(tokenizeURL, &http.Client{Timeout: 30 * time.Second})
	}
	return workload.ReadOpenAILog(bytes.NewReader(b), name, tok)
}

// sniffFormat returns the first line's field that tells the format.
func sniffFormat(log []byte) (string, error) {
	for line := range bytes.Lines(log) {
		if line = bytes.TrimSpace(line); len(line) == 0 {
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(line, &fields); err != nil {
			return "", fmt.Errorf("the first line is not a JSON object: %w", err)
		}
		for _, k := range []string{"hash_ids", "token_ids", "prompt", "messages"} {
			if fields[k] != nil {
				return k, nil
			}
		}
		return "", fmt.Errorf("the first line has none of hash_ids, token_ids, prompt or messages")
	}
	return "", fmt.Errorf("empty")
}

// VLLMTokenizer tokenizes OpenAI request bodies by posting their model
// and prompt or messages to a vLLM /tokenize endpoint at url.
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

// Analyze prints ac's log's reuse ceiling, its replay through
// round-robin, the peers, precise and precise+load at each cache size (hit
// rate, p99 and mean TTFT), which router did best at each size, and
// Verdict.
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
	o.Routers = append(append([]string{router.RoundRobin}, router.Peers...), router.Precise, router.PreciseLoad)
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
	fmt.Fprintln(w, "\nmean TTFT:")
	if err := writeSweepGrid(w, points, func(_ *SweepPoint, r *metrics.Result) string { return secs(r.TTFTMean) }, nil); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nbest at each size (lowest p99 TTFT, lowest mean TTFT, highest token hit rate):")
	for i := range points {
		fmt.Fprintf(w, "  %d blocks: %s\n", points[i].CacheBlocks, bestOf(points[i].Results))
	}
	fmt.Fprintf(w, "\nverdict: %s\n", Verdict(reuse, ac.Window, points))
	return nil
}

// bestOf names the routers with the lowest p99 and mean TTFT and the
// highest token hit rate among results that scheduled requests.
func bestOf(results []metrics.Result) string {
	var p99, mean, hit *metrics.Result
	for i := range results {
		r := &results[i]
		if r.Scheduled == 0 {
			continue
		}
		if p99 == nil || r.TTFTP99 < p99.TTFTP99 {
			p99 = r
		}
		if mean == nil || r.TTFTMean < mean.TTFTMean {
			mean = r
		}
		if hit == nil || r.TokenHitRate() > hit.TokenHitRate() {
			hit = r
		}
	}
	if p99 == nil {
		return "no router scheduled a request"
	}
	return fmt.Sprintf("p99 %s (%s), mean %s (%s), hit %s (%s)", p99.Router, secs(p99.TTFTP99), mean.Router, secs(mean.TTFTMean),
		hit.Router, pct(hit.TokenHitRate()))
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Verdict answers "does cache-aware routing pay on this traffic?": "no"
// when under 5% of prompt tokens repeat an earlier prefix within the
// window; "yes" when at some size precise+load caches 5 points more than
// round-robin or cuts p99 TTFT by 10%, without a p99 10% higher;
// "marginal" otherwise.
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

// ParseSizes parses comma-separated cache sizes in blocks (k: thousands).
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
