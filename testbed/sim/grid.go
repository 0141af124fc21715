package sim

import (
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/router"
)

// GridMooncakeSparse is the bundled trace with every request after the
// first GridSparsePause later (a sparse start).
const (
	GridMooncakeSparse = "mooncake-sparse"
	GridSparsePause    = 10 * time.Second
)

// GridWorkloads are the grid's workloads, in report order.
var GridWorkloads = []string{KindMooncake, GridMooncakeSparse, KindTenants, KindSessions, KindRAG, KindTools}

// GridLayouts are the hybrid model layouts (engine.Preset) the grid adds
// cells for, after the others, and GridHybridWorkloads the workloads they
// run: a conversation trace and multi-turn sessions.
var (
	GridLayouts         = []string{"gpt-oss", "qwen3-next"}
	GridHybridWorkloads = []string{KindMooncake, KindSessions}
)

// GridCell is one cell of the grid: a workload at a rate multiplier on
// engines of a cache size, named "<workload>-<rate>x-<cache>" (e.g.
// "rag-2x-12.5k", also its directory's name); a hybrid cell's engines
// run a model layout, named after it ("sessions-1x-25k-gpt-oss").
type GridCell struct {
	Name        string
	Workload    string
	Rate        float64
	CacheBlocks int
	Layout      string // an engine.Preset name; "" for the default engines
}

// GridConfig configures RunGrid.
type GridConfig struct {
	// Workloads, Rates and Caches span the grid (defaults: GridWorkloads;
	// 1 and 2; 25,000 and 12,500 blocks).
	Workloads []string
	Rates     []float64
	Caches    []int
	// Layouts are the hybrid cells' model layouts (default GridLayouts;
	// "none": no hybrid cell), each on the workloads of
	// GridHybridWorkloads the grid has, at its first rate, on every cache
	// size, every kvindex router also run as its PrefixOnly variant.
	Layouts []string
	Cells   []string // cells by name or path.Match pattern (empty: every cell)
	// Resume skips the picked cells that already have a results.csv
	// under Dir (an interrupted grid goes on where it stopped).
	Resume bool
	Dir    string // a directory per cell and the summary (default docs/results)
	// Trace, Seed and Requests (0: the suite as documented) are each
	// cell's WorkloadSpec's.
	Trace    string
	Seed     uint64
	Requests int
	// Options configure the fleet; Engine.CacheBlocks is each cell's.
	Options Options
}

func (gc *GridConfig) defaults() {
	if len(gc.Workloads) == 0 {
		gc.Workloads = GridWorkloads
	}
	if len(gc.Rates) == 0 {
		gc.Rates = []float64{1, 2}
	}
	if len(gc.Caches) == 0 {
		gc.Caches = []int{25000, 12500}
	}
	if len(gc.Layouts) == 0 {
		gc.Layouts = GridLayouts
	}
	gc.Dir = cmp.Or(gc.Dir, filepath.Join("docs", "results"))
}

// GridCells returns the cells Cells picks, in report order (workload,
// rate, cache size).
func (gc GridConfig) GridCells() ([]GridCell, error) {
	gc.defaults()
	for _, p := range gc.Cells {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("sim: grid: cell pattern %q: %w", p, err)
		}
	}
	var all []GridCell
	for _, w := range gc.Workloads {
		if !slices.Contains(GridWorkloads, w) {
			return nil, fmt.Errorf("sim: grid: workload %q (known: %s)", w, strings.Join(GridWorkloads, ", "))
		}
		for _, r := range gc.Rates {
			if r <= 0 {
				return nil, fmt.Errorf("sim: grid: rate %v", r)
			}
			for _, c := range gc.Caches {
				if c <= 0 {
					return nil, fmt.Errorf("sim: grid: cache size %d", c)
				}
				all = append(all, newGridCell(w, r, c, ""))
			}
		}
	}
	for _, l := range gc.Layouts {
		if l == "none" {
			continue
		}
		if _, err := engine.Preset(l); err != nil {
			return nil, fmt.Errorf("sim: grid: %w", err)
		}
		for _, w := range GridHybridWorkloads {
			if !slices.Contains(gc.Workloads, w) {
				continue
			}
			for _, c := range gc.Caches {
				all = append(all, newGridCell(w, gc.Rates[0], c, l))
			}
		}
	}
	var out []GridCell
	for _, cell := range all {
		picked := len(gc.Cells) == 0
		for _, p := range gc.Cells {
			ok, _ := path.Match(p, cell.Name)
			picked = picked || ok
		}
		if picked {
			out = append(out, cell)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sim: grid: no cell matches %q", gc.Cells)
	}
	return out, nil
}

// newGridCell names a cell of workload w at rate r on caches of c blocks,
// its engines running layout l ("": the default engines).
func newGridCell(w string, r float64, c int, l string) GridCell {
	name := fmt.Sprintf("%s-%sx-%s", w, strconv.FormatFloat(r, 'g', -1, 64), blocksLabel(c))
	if l != "" {
		name += "-" + l
	}
	return GridCell{Name: name, Workload: w, Rate: r, CacheBlocks: c, Layout: l}
}

// blocksLabel writes a cache size as the grid names it: 25000 "25k",
// 12500 "12.5k", 777 "777".
func blocksLabel(n int) string {
	if n >= 1000 && n%100 == 0 {
		return strconv.FormatFloat(float64(n)/1000, 'g', -1, 64) + "k"
	}
	return strconv.Itoa(n)
}

func (c GridCell) spec(trace string, seed uint64, requests int) WorkloadSpec {
	s := WorkloadSpec{Kind: c.Workload, Trace: trace, RateScale: c.Rate, Seed: seed, Requests: requests}
	if c.Workload == GridMooncakeSparse {
		s.Kind, s.Pause = KindMooncake, GridSparsePause
	}
	return s
}

// RunGrid runs the picked cells one after another into Dir/<cell>/
// (table.txt, results.csv, ttft_cdf.csv, cell.csv), then summarises every
// cell found under Dir, run now or earlier, into Dir/grid.md and
// Dir/grid.csv; it prints each table and the summary to w.
func RunGrid(ctx context.Context, gc GridConfig, w io.Writer) error {
	gc.defaults()
	cells, err := gc.GridCells()
	if err != nil {
		return err
	}
	for _, c := range cells {
		if _, err := os.Stat(filepath.Join(gc.Dir, c.Name, "results.csv")); gc.Resume && err == nil {
			fmt.Fprintf(w, "kvsim grid cell %s: kept (--resume)\n", c.Name)
			continue
		}
		if err := runCell(ctx, gc, c, w); err != nil {
			return fmt.Errorf("sim: grid cell %s: %w", c.Name, err)
		}
	}
	all := gc
	all.Cells = nil
	every, err := all.GridCells()
	if err != nil {
		return err
	}
	sum, err := ReadGrid(gc.Dir, every)
	if err != nil {
		return err
	}
	var b strings.Builder
	if err := WriteGridSummary(&b, sum); err != nil {
		return err
	}
	b.WriteString("\nprecise+load against the peers (p99 / mean TTFT / token hit rate; bold: a term precise+load lost):\n\n")
	if err := WritePeerSummary(&b, sum); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%s", b.String())
	if err := os.WriteFile(filepath.Join(gc.Dir, "grid.md"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	if err := writeCSV(filepath.Join(gc.Dir, "peers.csv"), peerCSV(sum)); err != nil {
		return err
	}
	return writeCSV(filepath.Join(gc.Dir, "grid.csv"), gridCSV(sum))
}

func runCell(ctx context.Context, gc GridConfig, c GridCell, w io.Writer) error {
	wl, err := LoadWorkload(c.spec(gc.Trace, gc.Seed, gc.Requests))
	if err != nil {
		return err
	}
	o := gc.Options
	o.Engine.CacheBlocks = c.CacheBlocks
	o.Seed = gc.Seed
	if c.Layout != "" {
		if o.Engine.Layout, err = engine.Preset(c.Layout); err != nil {
			return err
		}
		if len(o.Routers) == 0 {
			o.Routers = router.Names
		}
		o.Routers = WithPrefixOnly(o.Routers)
	}
	dir := filepath.Join(gc.Dir, c.Name)
	var b strings.Builder
	wall, err := run(ctx, "kvsim grid cell "+c.Name, wl, RunConfig{Options: o, CSVDir: dir}, &b)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "table.txt"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	meta := [][]string{{"cell", "workload", "rate", "cache_blocks", "wall_s", "layout"},
		{c.Name, c.Workload, fl(c.Rate), itoa(c.CacheBlocks), fl(wall.Seconds()), c.Layout}}
	if err := writeCSV(filepath.Join(dir, "cell.csv"), meta); err != nil {
		return err
	}
	_, err = io.WriteString(w, b.String()+"\n")
	return err
}

// GridResult is one cell's criterion, precise+load against the peers, and
// wall-clock time, as read back from its directory.
type GridResult struct {
	Cell      GridCell
	Criterion Criterion
	Peers     PeerVerdict // no Peers when none ran in the cell
	Wall      time.Duration
}

// ReadGrid reads the criterion of every cell of cells that has results
// under dir.
func ReadGrid(dir string, cells []GridCell) ([]GridResult, error) {
	var out []GridResult
	for _, c := range cells {
		rows, wall, err := readCell(filepath.Join(dir, c.Name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("sim: grid cell %s: %w", c.Name, err)
		}
		crit, err := EvaluateCriterion(rows)
		if err != nil {
			return nil, fmt.Errorf("sim: grid cell %s: %w", c.Name, err)
		}
		peers, err := EvaluatePeers(rows)
		if err != nil {
			return nil, fmt.Errorf("sim: grid cell %s: %w", c.Name, err)
		}
		out = append(out, GridResult{Cell: c, Criterion: crit, Peers: peers, Wall: wall})
	}
	return out, nil
}

// readCell reads a cell's results.csv router rows and cell.csv's wall time.
func readCell(dir string) ([]CriterionRow, time.Duration, error) {
	recs, err := readColumns(filepath.Join(dir, "results.csv"), "router", "scheduled", "token_hit_rate", "ttft_p99_s", "ttft_mean_s")
	if err != nil {
		return nil, 0, err
	}
	var rows []CriterionRow
	for _, r := range recs {
		if r[0] == "bound" {
			continue
		}
		sched, err1 := strconv.Atoi(r[1])
		hit, err2 := strconv.ParseFloat(r[2], 64)
		p99, err3 := strconv.ParseFloat(r[3], 64)
		mean, err4 := strconv.ParseFloat(r[4], 64)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, 0, fmt.Errorf("results.csv: router %s: %w", r[0], err)
		}
		rows = append(rows, CriterionRow{Router: r[0], Scheduled: sched, HitRate: hit, P99: seconds(p99), Mean: seconds(mean)})
	}
	var wall time.Duration // unknown when cell.csv is missing or unreadable
	if m, err := readColumns(filepath.Join(dir, "cell.csv"), "wall_s"); err == nil && len(m) > 0 {
		if s, err := strconv.ParseFloat(m[0][0], 64); err == nil {
			wall = seconds(s)
		}
	}
	return rows, wall, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// readColumns reads the CSV file at p (every row as wide as the header)
// and returns each row's values of the named columns.
func readColumns(p string, names ...string) ([][]string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	recs, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
	if err == nil && len(recs) == 0 {
		err = errors.New("empty")
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(p), err)
	}
	out := make([][]string, len(recs)-1)
	for _, n := range names {
		c := slices.Index(recs[0], n)
		if c < 0 {
			return nil, fmt.Errorf("%s: no column %q", filepath.Base(p), n)
		}
		for k, r := range recs[1:] {
			out[k] = append(out[k], r[c])
		}
	}
	return out, nil
}

// WriteGridSummary prints the criterion per cell as a Markdown table:
// every term's value, the best router's, and the verdicts.
func WriteGridSummary(w io.Writer, cells []GridResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "| cell | precise+load p99 | lowest p99 (router) | above | p99 ≤ +%.0f%% | precise+load mean | lowest mean (router) | above | mean ≤ +%.0f%% | precise+load hit | best hit (router) | share | hit ≥ %.0f%% | beaten on both by | met | wall |\n",
		100*P99Slack, 100*MeanSlack, 100*HitShare)
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	met := 0
	for _, g := range cells {
		c := &g.Criterion
		dom := "-"
		if len(c.Dominated) > 0 {
			dom = strings.Join(c.Dominated, ", ")
		}
		verdict := "**no**"
		if c.Met() {
			verdict, met = "yes", met+1
		}
		fmt.Fprintf(&b, "| %s | %s | %s (%s) | %+.1f%% | %s | %s | %s (%s) | %+.1f%% | %s | %s | %s (%s) | %.1f%% | %s | %s | %s | %s |\n",
			g.Cell.Name, gridSecs(c.P99.Value), gridSecs(c.P99.Best), c.P99.BestRouter, 100*(c.P99.Ratio()-1), yesNo(c.P99.OK),
			gridSecs(c.Mean.Value), gridSecs(c.Mean.Best), c.Mean.BestRouter, 100*(c.Mean.Ratio()-1), yesNo(c.Mean.OK),
			pct(c.Hit.Value), pct(c.Hit.Best), c.Hit.BestRouter, 100*c.Hit.Ratio(), yesNo(c.Hit.OK), dom, verdict,
			g.Wall.Round(time.Second))
	}
	fmt.Fprintf(&b, "\ncriterion met in %d of %d cells\n", met, len(cells))
	_, err := io.WriteString(w, b.String())
	return err
}

// gridSecs writes a TTFT in milliseconds below a second, else as secs.
func gridSecs(d time.Duration) string {
	if d < time.Second {
		return strconv.FormatInt(d.Round(time.Millisecond).Milliseconds(), 10) + "ms"
	}
	return secs(d)
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func gridCSV(cells []GridResult) [][]string {
	rows := [][]string{{"cell", "workload", "rate", "cache_blocks", "p99_s", "best_p99_s", "best_p99_router", "p99_ok",
		"mean_s", "best_mean_s", "best_mean_router", "mean_ok",
		"hit_rate", "best_hit_rate", "best_hit_router", "hit_target", "hit_ok", "dominated_by", "met", "wall_s", "layout"}}
	durTerm := func(t Term[time.Duration]) []string {
		return []string{fl(t.Value.Seconds()), fl(t.Best.Seconds()), t.BestRouter, strconv.FormatBool(t.OK)}
	}
	for _, g := range cells {
		c := &g.Criterion
		row := append([]string{g.Cell.Name, g.Cell.Workload, fl(g.Cell.Rate), itoa(g.Cell.CacheBlocks)}, durTerm(c.P99)...)
		row = append(row, durTerm(c.Mean)...)
		rows = append(rows, append(row, fl(c.Hit.Value), fl(c.Hit.Best), c.Hit.BestRouter, fl(HitShare), strconv.FormatBool(c.Hit.OK),
			strings.Join(c.Dominated, " "), strconv.FormatBool(c.Met()), fl(g.Wall.Seconds()), g.Cell.Layout))
	}
	return rows
}
