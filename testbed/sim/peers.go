package sim

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/router"
)

// What precise+load is held to against the peers (router.Peers) on a cell:
// its p99 and mean TTFT no worse than each peer's (within PeerTie counts as
// a tie) and its token hit rate at least PeerHitShare of the best peer's.
const (
	PeerTie      = 0.02
	PeerHitShare = 0.95
)

// PeerResult is one peer's p99, mean and hit rate on a cell, and whether
// precise+load's are no worse (P99OK, MeanOK).
type PeerResult struct {
	Router        string
	P99, Mean     time.Duration
	Hit           float64
	P99OK, MeanOK bool
}

// PeerVerdict is precise+load against the peers on one cell: its own
// p99, mean and hit rate, each peer's, and the hit-rate term against the
// best peer's.
type PeerVerdict struct {
	P99, Mean   time.Duration
	Hit         float64
	Peers       []PeerResult // in router.Peers order; only the peers that ran
	BestHit     float64
	BestHitPeer string
	HitOK       bool
}

// Won reports whether precise+load met every term against every peer that
// ran; false when none ran.
func (v *PeerVerdict) Won() bool {
	if len(v.Peers) == 0 || !v.HitOK {
		return false
	}
	for _, p := range v.Peers {
		if !p.P99OK || !p.MeanOK {
			return false
		}
	}
	return true
}

// Lost lists the peers precise+load lost a term to: "<peer> (p99, mean,
// hit)", the terms it lost.
func (v *PeerVerdict) Lost() []string {
	var out []string
	for _, p := range v.Peers {
		var terms []string
		if !p.P99OK {
			terms = append(terms, "p99")
		}
		if !p.MeanOK {
			terms = append(terms, "mean")
		}
		if !v.HitOK && p.Router == v.BestHitPeer {
			terms = append(terms, "hit")
		}
		if len(terms) > 0 {
			out = append(out, p.Router+" ("+strings.Join(terms, ", ")+")")
		}
	}
	return out
}

// EvaluatePeers judges precise+load against the peers among rows. It fails
// when precise+load is missing or ran no request.
func EvaluatePeers(rows []CriterionRow) (PeerVerdict, error) {
	var v PeerVerdict
	i := slices.IndexFunc(rows, func(r CriterionRow) bool { return r.Router == router.PreciseLoad })
	if i < 0 || rows[i].Scheduled == 0 {
		return v, fmt.Errorf("sim: peers: no %s row that ran", router.PreciseLoad)
	}
	pl := rows[i]
	v.P99, v.Mean, v.Hit = pl.P99, pl.Mean, pl.HitRate
	for _, name := range router.Peers {
		k := slices.IndexFunc(rows, func(r CriterionRow) bool { return r.Router == name })
		if k < 0 || rows[k].Scheduled == 0 {
			continue
		}
		r := rows[k]
		v.Peers = append(v.Peers, PeerResult{Router: name, P99: r.P99, Mean: r.Mean, Hit: r.HitRate,
			P99OK:  float64(pl.P99) <= (1+PeerTie)*float64(r.P99),
			MeanOK: float64(pl.Mean) <= (1+PeerTie)*float64(r.Mean)})
		if r.HitRate > v.BestHit || v.BestHitPeer == "" {
			v.BestHit, v.BestHitPeer = r.HitRate, name
		}
	}
	v.HitOK = pl.HitRate >= PeerHitShare*v.BestHit
	return v, nil
}

// WritePeerSummary prints, per cell, precise+load's p99 / mean / hit rate
// and each peer's, as a Markdown table; a peer's cell is bold where
// precise+load lost that term to it.
func WritePeerSummary(w io.Writer, cells []GridResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "| cell | precise+load p99 / mean / hit |")
	for _, p := range router.Peers {
		fmt.Fprintf(&b, " %s |", p)
	}
	b.WriteString(" won |\n|---|---|" + strings.Repeat("---|", len(router.Peers)+1) + "\n")
	won, judged := 0, 0
	for _, g := range cells {
		v := &g.Peers
		if len(v.Peers) == 0 {
			continue
		}
		judged++
		fmt.Fprintf(&b, "| %s | %s / %s / %s |", g.Cell.Name, gridSecs(v.P99), gridSecs(v.Mean), pct(v.Hit))
		for _, name := range router.Peers {
			k := slices.IndexFunc(v.Peers, func(p PeerResult) bool { return p.Router == name })
			if k < 0 {
				b.WriteString(" - |")
				continue
			}
			p := v.Peers[k]
			fmt.Fprintf(&b, " %s / %s / %s |", bold(gridSecs(p.P99), !p.P99OK), bold(gridSecs(p.Mean), !p.MeanOK),
				bold(pct(p.Hit), !v.HitOK && name == v.BestHitPeer))
		}
		verdict := "**no**: " + strings.Join(v.Lost(), "; ")
		if v.Won() {
			verdict = "yes"
			won++
		}
		fmt.Fprintf(&b, " %s |\n", verdict)
	}
	fmt.Fprintf(&b, "\nprecise+load met every term against every peer (p99 and mean TTFT within +%.0f%%, hit rate >= %.0f%% of the best peer's) in %d of %d cells\n",
		100*PeerTie, 100*PeerHitShare, won, judged)
	_, err := io.WriteString(w, b.String())
	return err
}

func bold(s string, on bool) string {
	if on {
		return "**" + s + "**"
	}
	return s
}

// peerCSV is the peer verdicts as rows: one per cell and peer.
func peerCSV(cells []GridResult) [][]string {
	rows := [][]string{{"cell", "peer", "peer_p99_s", "peer_mean_s", "peer_hit_rate", "p99_s", "mean_s", "hit_rate",
		"p99_ok", "mean_ok", "hit_ok", "won"}}
	for _, g := range cells {
		v := &g.Peers
		for _, p := range v.Peers {
			rows = append(rows, []string{g.Cell.Name, p.Router, fl(p.P99.Seconds()), fl(p.Mean.Seconds()), fl(p.Hit),
				fl(v.P99.Seconds()), fl(v.Mean.Seconds()), fl(v.Hit), strconv.FormatBool(p.P99OK), strconv.FormatBool(p.MeanOK),
				strconv.FormatBool(v.HitOK), strconv.FormatBool(v.Won())})
		}
	}
	return rows
}
