package sim

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/metrics"
)

func row(name string, hit float64, p99 time.Duration) CriterionRow {
	return CriterionRow{Router: name, HitRate: hit, P99: p99, Mean: p99 / 4, Scheduled: 100}
}

// withMean is r with mean TTFT m.
func withMean(r CriterionRow, m time.Duration) CriterionRow {
	r.Mean = m
	return r
}

func TestEvaluateCriterion(t *testing.T) {
	s := time.Second
	ms := time.Millisecond
	for _, tc := range []struct {
		name                 string
		rows                 []CriterionRow
		p99OK, meanOK, hitOK bool
		dominated            []string
		bestP99, bestMean    string
		bestHit              string
		excess, meanExcess   float64
		share                float64
	}{
		{
			name:  "best on both",
			rows:  []CriterionRow{row("round-robin", 0.1, 10*s), row("precise+load", 0.5, 2*s), row("ttft-greedy", 0.45, 2100*ms)},
			p99OK: true, meanOK: true, hitOK: true, bestP99: "precise+load", bestMean: "precise+load", bestHit: "precise+load", share: 1,
		},
		{
			// 5% above ttft-greedy's p99 and mean exactly passes; 90% of
			// precise's hit rate exactly passes.
			name: "at the edges",
			rows: []CriterionRow{withMean(row("precise", 0.50, 4*s), 2*s), withMean(row("precise+load", 0.45, 2100*ms), 1050*ms),
				withMean(row("ttft-greedy", 0.30, 2*s), s)},
			p99OK: true, meanOK: true, hitOK: true, bestP99: "ttft-greedy", bestMean: "ttft-greedy", bestHit: "precise",
			excess: 0.05, meanExcess: 0.05, share: 0.9,
		},
		{
			name:  "p99 just over",
			rows:  []CriterionRow{withMean(row("precise+load", 0.5, 2101*ms), 400*ms), withMean(row("ttft-greedy", 0.3, 2*s), 400*ms)},
			p99OK: false, meanOK: true, hitOK: true, bestP99: "ttft-greedy", bestMean: "precise+load", bestHit: "precise+load", excess: 0.0505, share: 1,
		},
		{
			// The lowest p99 and a mean 6% above another router's: the mean
			// term alone misses.
			name:  "mean just over",
			rows:  []CriterionRow{withMean(row("precise+load", 0.5, 2*s), 530*ms), withMean(row("approximate", 0.3, 3*s), 500*ms)},
			p99OK: true, meanOK: false, hitOK: true, bestP99: "precise+load", bestMean: "approximate", bestHit: "precise+load",
			meanExcess: 0.06, share: 1,
		},
		{
			// 89% of the best misses, at any rate.
			name:  "hit 89%",
			rows:  []CriterionRow{row("prefix-hash", 0.50, 9*s), row("precise+load", 0.445, 3*s)},
			p99OK: true, meanOK: true, hitOK: false, bestP99: "precise+load", bestMean: "precise+load", bestHit: "prefix-hash", share: 0.89,
		},
		{
			// Within every tolerance, yet another router is better on both
			// p99 and hit rate.
			name: "beaten on both",
			rows: []CriterionRow{withMean(row("precise+load", 0.50, 3030*ms), 700*ms), withMean(row("approximate", 0.51, 3*s), 800*ms),
				row("precise", 0.52, 5*s)},
			p99OK: true, meanOK: true, hitOK: true, dominated: []string{"approximate"}, bestP99: "approximate", bestMean: "precise+load",
			bestHit: "precise", excess: 0.01, share: 0.5 / 0.52,
		},
		{
			// A router that ran nothing takes no part (its 0 p99 and mean
			// are no best).
			name:  "a router with nothing scheduled",
			rows:  []CriterionRow{row("precise+load", 0.5, 2*s), {Router: "precise", Scheduled: 0}},
			p99OK: true, meanOK: true, hitOK: true, bestP99: "precise+load", bestMean: "precise+load", bestHit: "precise+load", share: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := EvaluateCriterion(tc.rows)
			if err != nil {
				t.Fatal(err)
			}
			if c.P99.OK != tc.p99OK || c.Mean.OK != tc.meanOK || c.Hit.OK != tc.hitOK || !slices.Equal(c.Dominated, tc.dominated) {
				t.Fatalf("p99 ok %v, mean ok %v, hit ok %v, dominated by %v; want %v, %v, %v, %v",
					c.P99.OK, c.Mean.OK, c.Hit.OK, c.Dominated, tc.p99OK, tc.meanOK, tc.hitOK, tc.dominated)
			}
			if want := tc.p99OK && tc.meanOK && tc.hitOK && len(tc.dominated) == 0; c.Met() != want {
				t.Fatalf("met %v, want %v", c.Met(), want)
			}
			if c.P99.BestRouter != tc.bestP99 || c.Mean.BestRouter != tc.bestMean || c.Hit.BestRouter != tc.bestHit {
				t.Fatalf("best p99 by %s, best mean by %s, best hit by %s; want %s, %s, %s",
					c.P99.BestRouter, c.Mean.BestRouter, c.Hit.BestRouter, tc.bestP99, tc.bestMean, tc.bestHit)
			}
			if d := c.P99.Ratio() - 1 - tc.excess; d > 1e-9 || d < -1e-9 {
				t.Fatalf("p99 excess %v, want %v", c.P99.Ratio()-1, tc.excess)
			}
			if d := c.Mean.Ratio() - 1 - tc.meanExcess; d > 1e-9 || d < -1e-9 {
				t.Fatalf("mean excess %v, want %v", c.Mean.Ratio()-1, tc.meanExcess)
			}
			if d := c.Hit.Ratio() - tc.share; d > 1e-9 || d < -1e-9 {
				t.Fatalf("hit share %v, want %v", c.Hit.Ratio(), tc.share)
			}
		})
	}
}

func TestEvaluateCriterionErrors(t *testing.T) {
	if _, err := EvaluateCriterion([]CriterionRow{row("precise", 0.5, time.Second)}); err == nil || !strings.Contains(err.Error(), "no precise+load row") {
		t.Fatalf("missing precise+load: error %v", err)
	}
	if _, err := EvaluateCriterion([]CriterionRow{{Router: "precise+load"}}); err == nil || !strings.Contains(err.Error(), "scheduled no request") {
		t.Fatalf("precise+load ran nothing: error %v", err)
	}
}

func TestGridCells(t *testing.T) {
	cells, err := GridConfig{}.GridCells()
	if err != nil {
		t.Fatal(err)
	}
	// 24 cells, then 2 layouts x 2 workloads x 2 caches at 1x.
	if len(cells) != 6*2*2+2*2*2 {
		t.Fatalf("%d cells, want 32", len(cells))
	}
	if c := cells[0]; c.Name != "mooncake-1x-25k" || c.Rate != 1 || c.CacheBlocks != 25000 || c.Layout != "" {
		t.Fatalf("first cell %+v", c)
	}
	if c := cells[23]; c.Name != "tools-2x-12.5k" || c.Rate != 2 || c.CacheBlocks != 12500 || c.Workload != KindTools {
		t.Fatalf("last cell before the hybrid ones %+v", c)
	}
	var hybrid []string
	for _, c := range cells[24:] {
		hybrid = append(hybrid, c.Name)
	}
	if want := []string{"mooncake-1x-25k-gpt-oss", "mooncake-1x-12.5k-gpt-oss", "sessions-1x-25k-gpt-oss", "sessions-1x-12.5k-gpt-oss",
		"mooncake-1x-25k-qwen3-next", "mooncake-1x-12.5k-qwen3-next", "sessions-1x-25k-qwen3-next", "sessions-1x-12.5k-qwen3-next"}; !slices.Equal(hybrid, want) {
		t.Fatalf("hybrid cells %v, want %v", hybrid, want)
	}
	if c := cells[24]; c.Layout != "gpt-oss" || c.Workload != KindMooncake || c.Rate != 1 {
		t.Fatalf("first hybrid cell %+v", c)
	}
	if n, err := (GridConfig{Layouts: []string{"none"}}).GridCells(); err != nil || len(n) != 24 {
		t.Fatalf("--layouts none: %d cells, %v", len(n), err)
	}
	picked, err := GridConfig{Cells: []string{"rag-*", "*-2x-12.5k"}}.GridCells()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range picked {
		names = append(names, c.Name)
	}
	want := []string{"mooncake-2x-12.5k", "mooncake-sparse-2x-12.5k", "tenants-2x-12.5k", "sessions-2x-12.5k",
		"rag-1x-25k", "rag-1x-12.5k", "rag-2x-25k", "rag-2x-12.5k", "tools-2x-12.5k"}
	if !slices.Equal(names, want) {
		t.Fatalf("picked %v, want %v", names, want)
	}
	sparse := cells[4].spec("", 1, 0)
	if cells[4].Workload != GridMooncakeSparse || sparse.Kind != KindMooncake || sparse.Pause != GridSparsePause {
		t.Fatalf("cell %s: spec %+v", cells[4].Name, sparse)
	}
	for _, bad := range []GridConfig{{Cells: []string{"nothing-*"}}, {Workloads: []string{"prefixes"}}, {Rates: []float64{0}}, {Cells: []string{"["}}, {Layouts: []string{"mistral"}}} {
		if _, err := bad.GridCells(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// TestReadGrid writes two cells' results as RunGrid does and reads the
// criterion back; a cell never run is skipped.
func TestReadGrid(t *testing.T) {
	dir := t.TempDir()
	res := func(name string, cached int64, p99, mean time.Duration) metrics.Result {
		return metrics.Result{Router: name, Requests: 10, Scheduled: 10, PromptTokens: 1000, CachedTokens: cached, TTFTP99: p99, TTFTMean: mean}
	}
	cells := []GridCell{
		{Name: "a-1x-25k", Rate: 1, CacheBlocks: 25000},
		{Name: "a-2x-25k", Rate: 2, CacheBlocks: 25000},
		{Name: "never-run", Rate: 1, CacheBlocks: 25000},
	}
	write := func(cell string, rs ...metrics.Result) {
		d := filepath.Join(dir, cell)
		if err := WriteCSV(d, rs, &Bounds{Requests: 10, PromptTokens: 1000, CachedTokens: 600}); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "cell.csv"), []byte("cell,wall_s\n"+cell+",12.5\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, ms := time.Second, time.Millisecond
	write("a-1x-25k", res("precise", 500, 4*s, 900*ms), res("precise+load", 440, 2*s, 500*ms))
	write("a-2x-25k", res("precise", 500, 4*s, 900*ms), res("precise+load", 460, 2*s, 500*ms))
	got, err := ReadGrid(dir, cells)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d cells read, want 2", len(got))
	}
	// 88% of the best hit rate misses, 92% passes.
	if got[0].Criterion.Met() || !got[1].Criterion.Met() || got[0].Wall != 12500*time.Millisecond {
		t.Fatalf("88%% met %v, 92%% met %v, wall %v", got[0].Criterion.Met(), got[1].Criterion.Met(), got[0].Wall)
	}
	if c := got[1].Criterion; c.Hit.Value != 0.46 || c.Hit.Best != 0.5 || c.P99.Value != 2*s || c.Mean.Value != 500*ms || c.Mean.Best != 500*ms ||
		c.Hit.BestRouter != "precise" {
		t.Fatalf("criterion read back %+v", c)
	}
	var b strings.Builder
	if err := WriteGridSummary(&b, got); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| cell | precise+load p99 | lowest p99 (router) | above | p99 ≤ +5% | precise+load mean | lowest mean (router) | above | mean ≤ +5% | precise+load hit | best hit (router) | share | hit ≥ 90% |",
		"| a-1x-25k | 2.00s | 2.00s (precise+load) | +0.0% | yes | 500ms | 500ms (precise+load) | +0.0% | yes | 44.0% | 50.0% (precise) | 88.0% | **no** | - | **no** | 13s |",
		"| a-2x-25k | 2.00s | 2.00s (precise+load) | +0.0% | yes | 500ms | 500ms (precise+load) | +0.0% | yes | 46.0% | 50.0% (precise) | 92.0% | yes | - | yes |",
		"criterion met in 1 of 2 cells"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("summary lacks %q:\n%s", want, b.String())
		}
	}
	// A cell whose results lack precise+load is an error, not a pass.
	write("a-1x-25k", res("precise", 500, 4*s, 900*ms))
	if _, err := ReadGrid(dir, cells); err == nil {
		t.Fatal("a cell without precise+load was read")
	}
}

// TestRunGrid runs a small grid end to end: each cell's files, and the
// summary over the cells on disk.
func TestRunGrid(t *testing.T) {
	dir := t.TempDir()
	gc := GridConfig{Workloads: []string{KindRAG}, Caches: []int{2000}, Requests: 150, Dir: dir, Seed: 1,
		Options: Options{Routers: []string{"round-robin", "precise", "precise+load"}}}
	var out strings.Builder
	if err := RunGrid(context.Background(), gc, &out); err != nil {
		t.Fatal(err)
	}
	for _, cell := range []string{"rag-1x-2k", "rag-2x-2k"} {
		for _, f := range []string{"table.txt", "results.csv", "ttft_cdf.csv", "cell.csv"} {
			if _, err := os.Stat(filepath.Join(dir, cell, f)); err != nil {
				t.Fatalf("cell %s: %v", cell, err)
			}
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "grid.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| rag-1x-2k | ", "| rag-2x-2k | ", "of 2 cells"} {
		if !strings.Contains(string(md), want) || !strings.Contains(out.String(), want) {
			t.Fatalf("summary lacks %q:\n%s", want, md)
		}
	}
	if !strings.Contains(out.String(), "kvsim grid cell rag-2x-2k (virtual time): rag: 150 requests") {
		t.Fatalf("output:\n%s", out.String())
	}
	// Rerunning one cell keeps the other in the summary.
	gc.Cells = []string{"rag-2x-*"}
	out.Reset()
	if err := RunGrid(context.Background(), gc, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "kvsim grid cell rag-1x-2k") || !strings.Contains(out.String(), "| rag-1x-2k | ") {
		t.Fatalf("a rerun of rag-2x-2k alone:\n%s", out.String())
	}
}

// TestRunGridHybridCell: a hybrid cell's engines run its layout, its
// kvindex routers also run by the prefix group alone, beside them in its
// table, and those variants are not held against precise+load.
func TestRunGridHybridCell(t *testing.T) {
	dir := t.TempDir()
	gc := GridConfig{Workloads: []string{KindSessions}, Rates: []float64{1}, Caches: []int{2000}, Requests: 8, Dir: dir, Seed: 1,
		Layouts: []string{"gpt-oss"}, Cells: []string{"*-gpt-oss"},
		Options: Options{Routers: []string{"round-robin", "precise", "precise+load"}}}
	var out strings.Builder
	if err := RunGrid(context.Background(), gc, &out); err != nil {
		t.Fatal(err)
	}
	table, err := os.ReadFile(filepath.Join(dir, "sessions-1x-2k-gpt-oss", "table.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"KV-cache groups gpt-oss: 1 sliding_window (window 128) + 1 full_attention", " precise/prefix-only ", " precise+load/prefix-only "} {
		if !strings.Contains(string(table), want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if strings.Contains(out.String(), "kvsim grid cell sessions-1x-2k (") {
		t.Errorf("the llama cell ran too:\n%s", out.String())
	}
	got, err := ReadGrid(dir, []GridCell{newGridCell(KindSessions, 1, 2000, "gpt-oss")})
	if err != nil || len(got) != 1 {
		t.Fatalf("read back %d cells: %v", len(got), err)
	}
	c := got[0].Criterion
	for _, r := range append([]string{c.P99.BestRouter, c.Mean.BestRouter, c.Hit.BestRouter}, c.Dominated...) {
		if strings.HasSuffix(r, PrefixOnly) {
			t.Errorf("criterion %+v holds a prefix-only variant against precise+load", c)
		}
	}
}
