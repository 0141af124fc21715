package workload

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

// promptKey identifies a prompt's segments exactly.
func promptKey(segs []Segment) string {
	b := make([]byte, 0, 16*len(segs))
	for _, s := range segs {
		b = append(b, byte(s.ID), byte(s.ID>>8), byte(s.ID>>16), byte(s.ID>>24), byte(s.ID>>32), byte(s.ID>>40), byte(s.ID>>48), byte(s.ID>>56),
			byte(s.Len), byte(s.Len>>8), byte(s.Len>>16), byte(s.Len>>24), ';')
	}
	return string(b)
}

// checkExtends checks that every request whose prompt is longer than
// minSegs segments extends an earlier request's prompt by that request's
// answer (as long as its output) and one new input, and arrives at least
// the answer's time after it. It returns how many requests were followups.
func checkExtends(t *testing.T, w *Workload, minSegs int) int {
	t.Helper()
	seen := map[string]*Request{}
	followups := 0
	for i := range w.Requests {
		r := &w.Requests[i]
		if len(r.Prompt) > minSegs {
			prev, ok := seen[promptKey(r.Prompt[:len(r.Prompt)-2])]
			if !ok {
				t.Fatalf("request %d (%d segments) extends no earlier prompt", i, len(r.Prompt))
			}
			if ans := r.Prompt[len(r.Prompt)-2]; ans.Len != prev.OutputLen {
				t.Fatalf("request %d repeats an answer of %d tokens; the earlier turn generated %d", i, ans.Len, prev.OutputLen)
			}
			if gap := r.Arrival - prev.Arrival; gap < time.Duration(prev.OutputLen)*answerPace {
				t.Fatalf("request %d arrives %v after its previous turn, before that turn's %d-token answer", i, gap, prev.OutputLen)
			}
			followups++
		}
		seen[promptKey(r.Prompt)] = r
	}
	return followups
}

func TestSessionsShape(t *testing.T) {
	c := SessionsConfig{Sessions: 300, Seed: 3}
	w, err := Sessions(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	again, _ := Sessions(c)
	if !reflect.DeepEqual(w, again) {
		t.Fatal("the same config and seed gave different sessions")
	}
	other, _ := Sessions(SessionsConfig{Sessions: 300, Seed: 4})
	if reflect.DeepEqual(w.Requests[0].Prompt, other.Requests[0].Prompt) {
		t.Fatal("another seed gave the same first prompt")
	}
	// Every turn after the first is the previous turn plus its answer and
	// a new input; first turns are a system prompt and an input.
	followups := checkExtends(t, w, 2)
	firsts := len(w.Requests) - followups
	if firsts != 300 {
		t.Fatalf("%d first turns, want one per session (300)", firsts)
	}
	// About MeanTurns (6) turns per session.
	if per := float64(len(w.Requests)) / 300; per < 5 || per > 7 {
		t.Fatalf("%.2f turns per session, want about 6", per)
	}
	// System prompts: Zipf, prompt 0 the most popular, at most 32 of them.
	count := map[uint64]int{}
	for i := range w.Requests {
		if len(w.Requests[i].Prompt) == 2 {
			count[w.Requests[i].Prompt[0].ID]++
		}
	}
	top := count[Mix64(systemTag^3)] // prompt 0 of seed 3
	if len(count) > 32 || len(count) < 10 {
		t.Fatalf("%d distinct system prompts", len(count))
	}
	for id, n := range count {
		if n > top {
			t.Fatalf("system prompt %x starts %d sessions, more than prompt 0's %d", id, n, top)
		}
	}
	if top < 300/8 {
		t.Fatalf("the most popular system prompt starts %d of 300 sessions; Zipf(1.1) over 32 gives about a quarter", top)
	}
	// Histories grow: the longest prompt holds many turns.
	longest := slices.MaxFunc(w.Requests, func(a, b Request) int { return a.PromptLen - b.PromptLen })
	if len(longest.Prompt) < 2+2*10 {
		t.Fatalf("the longest prompt has %d segments; some session should reach 10+ turns", len(longest.Prompt))
	}
}

func TestToolAgentsShape(t *testing.T) {
	c := ToolAgentsConfig{Tasks: 300, Seed: 5}
	w, err := ToolAgents(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	again, _ := ToolAgents(c)
	if !reflect.DeepEqual(w, again) {
		t.Fatal("the same config and seed gave different tasks")
	}
	// Step 0 is catalog, agent, task; every later step extends the
	// previous one by its tool call and the tool's result.
	followups := checkExtends(t, w, 3)
	if firsts := len(w.Requests) - followups; firsts != 300 {
		t.Fatalf("%d first steps, want one per task (300)", firsts)
	}
	agentsOf := map[uint64]map[uint64]bool{}
	for i := range w.Requests {
		p := w.Requests[i].Prompt
		if len(p) < 3 {
			t.Fatalf("request %d has %d segments", i, len(p))
		}
		if agentsOf[p[0].ID] == nil {
			agentsOf[p[0].ID] = map[uint64]bool{}
		}
		agentsOf[p[0].ID][p[1].ID] = true
	}
	// The tool list leads every prompt, and is shared across agents: 6
	// catalogs at most, the most popular one used by many agents.
	if len(agentsOf) > 6 {
		t.Fatalf("%d distinct leading segments, want at most the 6 catalogs", len(agentsOf))
	}
	most := 0
	for _, a := range agentsOf {
		most = max(most, len(a))
	}
	if most < 30 {
		t.Fatalf("the most shared catalog is used by %d agents; want many (Zipf over 200 agents)", most)
	}
	// Catalogs are long: the shared part dominates a first step.
	var catalog, total int64
	for i := range w.Requests {
		if p := w.Requests[i].Prompt; len(p) == 3 {
			catalog += int64(p[0].Len)
			total += int64(w.Requests[i].PromptLen)
		}
	}
	if float64(catalog) < 0.7*float64(total) {
		t.Fatalf("catalogs are %d of %d first-step tokens; want most", catalog, total)
	}
}

func TestRAGShape(t *testing.T) {
	c := RAGConfig{Requests: 2000, Seed: 7}
	w, err := RAG(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	again, _ := RAG(c)
	if !reflect.DeepEqual(w, again) {
		t.Fatal("the same config and seed gave different requests")
	}
	system := w.Requests[0].Prompt[0]
	positions := map[uint64]map[int]bool{} // document -> positions it appeared at
	orders := map[string]map[string]bool{} // topic + document set -> orders seen
	for i := range w.Requests {
		p := w.Requests[i].Prompt
		if len(p) != 1+5+1 || p[0] != system {
			t.Fatalf("request %d: %d segments, want the system prompt, 5 documents and the question", i, len(p))
		}
		docs := p[1:6]
		for pos, d := range docs {
			if positions[d.ID] == nil {
				positions[d.ID] = map[int]bool{}
			}
			positions[d.ID][pos] = true
			if d.Len < 450 || d.Len > 750 {
				t.Fatalf("request %d: a document of %d tokens, want 450-750", i, d.Len)
			}
		}
		set := slices.Clone(docs)
		slices.SortFunc(set, func(a, b Segment) int { return cmpU64(a.ID, b.ID) })
		key := w.Requests[i].Group + promptKey(set)
		if orders[key] == nil {
			orders[key] = map[string]bool{}
		}
		orders[key][promptKey(docs)] = true
	}
	// Documents recur, at different positions.
	moved := 0
	for _, pos := range positions {
		if len(pos) > 1 {
			moved++
		}
	}
	if moved < 100 {
		t.Fatalf("%d documents appeared at more than one position; want many", moved)
	}
	// The same documents for the same topic come in different orders.
	reordered := 0
	for _, o := range orders {
		if len(o) > 1 {
			reordered++
		}
	}
	if reordered < 20 {
		t.Fatalf("%d (topic, document set) pairs seen in more than one order; want many", reordered)
	}

	// An exact retriever gives a topic the same documents in the same
	// order every time.
	exact, err := RAG(RAGConfig{Requests: 2000, Seed: 7, Exact: true})
	if err != nil {
		t.Fatal(err)
	}
	byTopic := map[string]string{}
	for i := range exact.Requests {
		r := &exact.Requests[i]
		k := promptKey(r.Prompt[1:6])
		if prev, ok := byTopic[r.Group]; ok && prev != k {
			t.Fatalf("exact retriever: %s retrieved two different document lists", r.Group)
		}
		byTopic[r.Group] = k
	}
	if _, err := RAG(RAGConfig{Exact: true, Noise: 1}); err == nil {
		t.Fatal("an exact retriever with noise was accepted")
	}
	if _, err := RAG(RAGConfig{Retrieved: 11}); err == nil {
		t.Fatal("retrieving more documents than a topic has was accepted")
	}
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestSuiteRejectsBadParameters(t *testing.T) {
	if _, err := Sessions(SessionsConfig{MeanTurns: 0.5}); err == nil {
		t.Error("sessions: a mean of half a turn was accepted")
	}
	if _, err := Sessions(SessionsConfig{SessionRate: -1}); err == nil {
		t.Error("sessions: a negative rate was accepted")
	}
	if _, err := ToolAgents(ToolAgentsConfig{Catalogs: -1}); err == nil {
		t.Error("tools: negative catalogs were accepted")
	}
	if _, err := RAG(RAGConfig{QPS: -2}); err == nil {
		t.Error("rag: a negative rate was accepted")
	}
}
