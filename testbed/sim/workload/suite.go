package workload

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// Tags that keep the content ids of the suite's generators apart from each
// other and from the older generators'.
const (
	systemTag  = 0x73797374656d0000 // "system"
	turnTag    = 0x7475726e00000000 // "turn"
	answerTag  = 0x616e737765720000 // "answer"
	docTag     = 0x646f630000000000 // "doc"
	ragTag     = 0x7261670000000000 // "rag"
	catalogTag = 0x636174616c6f6700 // "catalog"
	agentTag   = 0x6167656e74000000 // "agent"
	taskTag    = 0x7461736b00000000 // "task"
)

// answerPace is the time a turn's answer is assumed to take per output
// token when the next turn's arrival is placed: a decode step of a busy
// engine (20 ms, tens of requests in the batch). The generators are open
// loop, so the next turn arrives that long after the previous one plus
// the think time, whatever the router did.
const answerPace = 20 * time.Millisecond

// SessionsConfig describes multi-turn agent sessions: each session starts
// with one of SystemPrompts system prompts (Zipf popularity) and runs a
// geometric number of turns; turn k's prompt is the system prompt, every
// earlier turn's input and answer, and its own input, so each turn
// extends the previous turn's prompt by that turn's answer and a new
// input. Sessions start as a Poisson process; a turn arrives after the
// previous turn's answer (OutputLen x 20 ms) and an exponential think
// time. Lengths are log-normal around their means (sigma 0.8), the
// heavy-tailed shape of published chat and agent traces (ShareGPT,
// Mooncake: short user turns, a long tail of pasted or tool-produced
// context).
type SessionsConfig struct {
	// Sessions is the number of sessions (default 1,200).
	Sessions int
	// SystemPrompts is the number of distinct system prompts (default 32);
	// SystemTokens their mean length (default 2,500; each prompt's own
	// length is drawn once).
	SystemPrompts, SystemTokens int
	// ZipfS is the system prompts' popularity exponent (0: 1.1).
	ZipfS float64
	// MeanTurns is the mean number of turns per session, geometric, at
	// least 1 (default 6); MaxTurns caps it (default 24).
	MeanTurns float64
	MaxTurns  int
	// InputTokens is the mean length of a turn's new input: the user's
	// message or a tool's result (default 600).
	InputTokens int
	// OutputTokens is the mean length of a turn's answer (default 250).
	OutputTokens int
	// ThinkTime is the mean pause between an answer and the next turn
	// (default 10 s).
	ThinkTime time.Duration
	// SessionRate is the rate at which sessions start, per second
	// (default 3).
	SessionRate float64
	// Engines is the fleet size the workload is meant for (default 8).
	Engines int
	// Seed makes the draw reproducible.
	Seed uint64
}

func (c *SessionsConfig) defaults() {
	setDefault(&c.Sessions, 1200)
	setDefault(&c.SystemPrompts, 32)
	setDefault(&c.SystemTokens, 2500)
	setDefault(&c.MaxTurns, 24)
	setDefault(&c.InputTokens, 600)
	setDefault(&c.OutputTokens, 250)
	setDefault(&c.Engines, 8)
	setDefault(&c.ZipfS, DefaultZipfS)
	setDefault(&c.MeanTurns, 6)
	setDefault(&c.ThinkTime, 10*time.Second)
	setDefault(&c.SessionRate, 3)
}

// Sessions generates multi-turn agent sessions.
func Sessions(c SessionsConfig) (*Workload, error) {
	c.defaults()
	if c.Sessions < 0 || c.SystemPrompts <= 0 || c.SystemTokens <= 0 || c.MeanTurns < 1 || c.MaxTurns < 1 ||
		c.InputTokens <= 0 || c.OutputTokens <= 0 || c.ThinkTime < 0 || c.SessionRate <= 0 || c.ZipfS < 0 {
		return nil, fmt.Errorf("workload: sessions: invalid parameters %+v", c)
	}
	rng := rand.New(rand.NewPCG(c.Seed, systemTag))
	system := make([]Segment, c.SystemPrompts)
	for k := range system {
		system[k] = Segment{ID: mix64(systemTag ^ c.Seed ^ uint64(k)), Len: logNormal(rng, c.SystemTokens, 0.4)}
	}
	cdf := ZipfCDF(c.SystemPrompts, c.ZipfS)
	var reqs []Request
	var start float64
	for s := range c.Sessions {
		start += rng.ExpFloat64() / c.SessionRate
		k := cdf.Pick(rng)
		turns := geometric(rng, c.MeanTurns, c.MaxTurns)
		id := func(tag uint64, turn int) uint64 { return mix64(tag ^ c.Seed ^ uint64(s)<<20 ^ uint64(turn)) }
		reqs = appendConversation(reqs, rng, conversation{
			prefix: []Segment{system[k]}, start: start, steps: turns, group: "system-" + strconv.Itoa(k),
			input:  func(turn int) Segment { return Segment{ID: id(turnTag, turn), Len: logNormal(rng, c.InputTokens, 0.8)} },
			output: func(int) int { return logNormal(rng, c.OutputTokens, 0.8) },
			answer: func(turn, n int) Segment { return Segment{ID: id(answerTag, turn), Len: n} },
			think:  c.ThinkTime,
		})
	}
	return sortedWorkload("sessions", c.Engines, reqs), nil
}

// ToolAgentsConfig describes tool-calling agents with long shared tool
// lists: Catalogs tool catalogs (each the JSON schemas of a tool server's
// tools, thousands of tokens) are shared by Agents agents (Zipf
// popularity of catalogs across agents), each with its own instructions.
// Tasks arrive as a Poisson process, each for an agent chosen uniformly;
// a task is a loop of steps: the prompt is the catalog, the agent's
// instructions, the task, and every earlier step's tool call and tool
// result, in that order (tools first, then the system prompt, then the
// messages: the order in which hosted APIs document their prompt-cache
// prefixes), and each step's output is the next tool call. A step arrives
// after the previous call (OutputLen x 20 ms) and the tool's latency
// (exponential).
type ToolAgentsConfig struct {
	// Tasks is the number of tasks (default 1,000).
	Tasks int
	// Catalogs is the number of distinct tool lists (default 6);
	// CatalogTokens their mean length (default 8,000).
	Catalogs, CatalogTokens int
	// ZipfS is the catalogs' popularity across agents (0: 1.1).
	ZipfS float64
	// Agents is the number of agents (default 200); AgentTokens the mean
	// length of an agent's instructions (default 800).
	Agents, AgentTokens int
	// TaskTokens is the mean length of a task's request (default 400).
	TaskTokens int
	// MeanSteps is the mean number of steps per task, geometric, at least
	// 1 (default 5); MaxSteps caps it (default 16).
	MeanSteps float64
	MaxSteps  int
	// CallTokens is the mean length of a step's output (a tool call, or
	// the final answer; default 80).
	CallTokens int
	// ResultTokens is the mean length of a tool's result (default 700).
	ResultTokens int
	// ToolTime is the mean latency of a tool call (default 2 s).
	ToolTime time.Duration
	// TaskRate is the rate at which tasks start, per second (default 3).
	TaskRate float64
	// Engines is the fleet size the workload is meant for (default 8).
	Engines int
	// Seed makes the draw reproducible.
	Seed uint64
}

func (c *ToolAgentsConfig) defaults() {
	setDefault(&c.Tasks, 1000)
	setDefault(&c.Catalogs, 6)
	setDefault(&c.CatalogTokens, 8000)
	setDefault(&c.Agents, 200)
	setDefault(&c.AgentTokens, 800)
	setDefault(&c.TaskTokens, 400)
	setDefault(&c.MaxSteps, 16)
	setDefault(&c.CallTokens, 80)
	setDefault(&c.ResultTokens, 700)
	setDefault(&c.Engines, 8)
	setDefault(&c.ZipfS, DefaultZipfS)
	setDefault(&c.MeanSteps, 5)
	setDefault(&c.ToolTime, 2*time.Second)
	setDefault(&c.TaskRate, 3)
}

// ToolAgents generates tool-calling agents.
func ToolAgents(c ToolAgentsConfig) (*Workload, error) {
	c.defaults()
	if c.Tasks < 0 || c.Catalogs <= 0 || c.CatalogTokens <= 0 || c.Agents <= 0 || c.AgentTokens <= 0 || c.TaskTokens <= 0 ||
		c.MeanSteps < 1 || c.MaxSteps < 1 || c.CallTokens <= 0 || c.ResultTokens <= 0 || c.ToolTime < 0 || c.TaskRate <= 0 || c.ZipfS < 0 {
		return nil, fmt.Errorf("workload: tools: invalid parameters %+v", c)
	}
	rng := rand.New(rand.NewPCG(c.Seed, catalogTag))
	catalogs := make([]Segment, c.Catalogs)
	for k := range catalogs {
		catalogs[k] = Segment{ID: mix64(catalogTag ^ c.Seed ^ uint64(k)), Len: logNormal(rng, c.CatalogTokens, 0.4)}
	}
	cdf := ZipfCDF(c.Catalogs, c.ZipfS)
	agentCatalog := make([]int, c.Agents)
	agents := make([]Segment, c.Agents)
	for a := range agents {
		agentCatalog[a] = cdf.Pick(rng)
		agents[a] = Segment{ID: mix64(agentTag ^ c.Seed ^ uint64(a)), Len: logNormal(rng, c.AgentTokens, 0.5)}
	}
	var reqs []Request
	var start float64
	for task := range c.Tasks {
		start += rng.ExpFloat64() / c.TaskRate
		a := rng.IntN(c.Agents)
		id := func(tag uint64, step int) uint64 { return mix64(tag ^ c.Seed ^ uint64(task)<<20 ^ uint64(step)) }
		prefix := []Segment{catalogs[agentCatalog[a]], agents[a], {ID: id(taskTag, 0), Len: logNormal(rng, c.TaskTokens, 0.8)}}
		reqs = appendConversation(reqs, rng, conversation{
			prefix: prefix, start: start, steps: geometric(rng, c.MeanSteps, c.MaxSteps), group: "catalog-" + strconv.Itoa(agentCatalog[a]),
			input: func(step int) Segment {
				return Segment{ID: id(turnTag, step), Len: logNormal(rng, c.ResultTokens, 0.8)}
			},
			output: func(int) int { return logNormal(rng, c.CallTokens, 0.5) },
			answer: func(step, n int) Segment { return Segment{ID: id(answerTag, step), Len: n} },
			think:  c.ToolTime,
			first:  true,
		})
	}
	return sortedWorkload("tools", c.Engines, reqs), nil
}

// conversation is one session or task: a fixed prefix, then steps that
// each add the previous step's output and a new input.
type conversation struct {
	prefix []Segment
	start  float64 // seconds
	steps  int
	group  string
	// input returns step k's new input; output step k's output length;
	// answer the segment that repeats step k's output of n tokens in
	// later prompts.
	input  func(k int) Segment
	output func(k int) int
	answer func(k, n int) Segment
	think  time.Duration
	// first: step 0's prompt is the prefix alone (a tool loop's first
	// step acts on the task); otherwise every step adds an input.
	first bool
}

// appendConversation appends cv's requests (IDs unset) to reqs.
func appendConversation(reqs []Request, rng *rand.Rand, cv conversation) []Request {
	prompt := slices.Clone(cv.prefix)
	at := cv.start
	for k := range cv.steps {
		if k > 0 || !cv.first {
			prompt = append(prompt, cv.input(k))
		}
		out := cv.output(k)
		reqs = append(reqs, newRequest(0, at, slices.Clip(slices.Clone(prompt)), out, cv.group))
		prompt = append(prompt, cv.answer(k, out))
		at += (time.Duration(out)*answerPace + time.Duration(rng.ExpFloat64()*float64(cv.think))).Seconds()
	}
	return reqs
}

// sortedWorkload sorts reqs by arrival (stably: a conversation's steps keep their
// order), numbers them, and names the workload.
func sortedWorkload(name string, engines int, reqs []Request) *Workload {
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	for i := range reqs {
		reqs[i].ID = i
	}
	return &Workload{Name: name, Engines: engines, Requests: reqs}
}

// RAGConfig describes retrieval-augmented generation: every prompt is a
// shared system prompt, Retrieved documents from a corpus, and the user's
// question. Questions fall into Topics topics (Zipf popularity); each
// topic has TopicDocs relevant documents in a fixed relevance order, and
// each request retrieves the Retrieved best of them after adding Gaussian
// noise of standard deviation Noise (in ranks) to their scores, so the
// same documents recur across requests in different orders and subsets
// (a retriever's scores move with the wording of the question). Topics
// draw their documents from one corpus, so a document also recurs across
// topics. Document lengths are chunk-sized (uniform within 25% of
// DocTokens). Arrivals are Poisson at QPS.
type RAGConfig struct {
	// Requests is the number of requests (default 8,000).
	Requests int
	// Documents is the corpus size (default 3,000); DocTokens a
	// document's mean length (default 600).
	Documents, DocTokens int
	// Topics is the number of topics (default 400); TopicDocs the
	// documents relevant to each (default 10); Retrieved the documents
	// each prompt holds (default 5).
	Topics, TopicDocs, Retrieved int
	// Noise is the standard deviation of the score noise, in ranks
	// (0: 1; use Exact for a deterministic retriever).
	Noise float64
	// Exact retrieves the same documents in the same order for every
	// question of a topic; Noise must then be 0.
	Exact bool
	// ZipfS is the topics' popularity exponent (0: 1.1).
	ZipfS float64
	// SystemTokens is the shared system prompt (default 400);
	// QueryTokens the question's mean length (default 80).
	SystemTokens, QueryTokens int
	// OutputTokens is the answer's mean length (default 200).
	OutputTokens int
	// QPS is the Poisson arrival rate (default 16).
	QPS float64
	// Engines is the fleet size the workload is meant for (default 8).
	Engines int
	// Seed makes the draw reproducible.
	Seed uint64
}

func (c *RAGConfig) defaults() {
	setDefault(&c.Requests, 8000)
	setDefault(&c.Documents, 3000)
	setDefault(&c.DocTokens, 600)
	setDefault(&c.Topics, 400)
	setDefault(&c.TopicDocs, 10)
	setDefault(&c.Retrieved, 5)
	setDefault(&c.SystemTokens, 400)
	setDefault(&c.QueryTokens, 80)
	setDefault(&c.OutputTokens, 200)
	setDefault(&c.Engines, 8)
	if c.Noise == 0 && !c.Exact {
		c.Noise = 1
	}
	setDefault(&c.ZipfS, DefaultZipfS)
	setDefault(&c.QPS, 16)
}

// RAG generates the retrieval-augmented workload.
func RAG(c RAGConfig) (*Workload, error) {
	if c.Exact && c.Noise != 0 {
		return nil, fmt.Errorf("workload: rag: an exact retriever with noise %v", c.Noise)
	}
	c.defaults()
	if c.Requests < 0 || c.Documents <= 0 || c.DocTokens <= 0 || c.Topics <= 0 || c.TopicDocs <= 0 || c.Retrieved <= 0 ||
		c.Retrieved > c.TopicDocs || c.TopicDocs > c.Documents || c.Noise < 0 || c.SystemTokens <= 0 || c.QueryTokens <= 0 ||
		c.OutputTokens <= 0 || c.QPS <= 0 || c.ZipfS < 0 {
		return nil, fmt.Errorf("workload: rag: invalid parameters %+v", c)
	}
	rng := rand.New(rand.NewPCG(c.Seed, ragTag))
	docs := make([]Segment, c.Documents)
	for d := range docs {
		docs[d] = Segment{ID: mix64(docTag ^ c.Seed ^ uint64(d)), Len: max(1, int(float64(c.DocTokens)*(0.75+0.5*rng.Float64())))}
	}
	topics := make([][]int, c.Topics)
	for t := range topics {
		topics[t] = rng.Perm(c.Documents)[:c.TopicDocs]
	}
	system := Segment{ID: mix64(systemTag ^ ragTag ^ c.Seed), Len: c.SystemTokens}
	cdf := ZipfCDF(c.Topics, c.ZipfS)
	w := &Workload{Name: "rag", Engines: c.Engines, Requests: make([]Request, c.Requests)}
	type scored struct {
		doc   int
		score float64
	}
	cand := make([]scored, c.TopicDocs)
	var t float64
	for i := range w.Requests {
		t += rng.ExpFloat64() / c.QPS
		topic := cdf.Pick(rng)
		for r, d := range topics[topic] {
			cand[r] = scored{doc: d, score: -float64(r) + c.Noise*rng.NormFloat64()}
		}
		slices.SortStableFunc(cand, func(a, b scored) int { return cmp.Compare(b.score, a.score) })
		segs := []Segment{system}
		for _, s := range cand[:c.Retrieved] {
			segs = append(segs, docs[s.doc])
		}
		segs = append(segs, Segment{ID: mix64(queryTag ^ ragTag ^ c.Seed ^ uint64(i)<<8), Len: logNormal(rng, c.QueryTokens, 0.6)})
		w.Requests[i] = newRequest(i, t, segs, logNormal(rng, c.OutputTokens, 0.6), "topic-"+strconv.Itoa(topic))
	}
	return w, nil
}

// logNormal draws a log-normal length with the given mean and sigma (of
// the underlying normal), at least 1 and at most 8x the mean.
func logNormal(rng *rand.Rand, mean int, sigma float64) int {
	mu := math.Log(float64(mean)) - sigma*sigma/2
	v := math.Exp(mu + sigma*rng.NormFloat64())
	return int(min(max(1, math.Round(v)), 8*float64(mean)))
}

// geometric draws a count >= 1 with the given mean, capped at limit.
func geometric(rng *rand.Rand, mean float64, limit int) int {
	p := 1 / mean
	n := 1
	for n < limit && rng.Float64() >= p {
		n++
	}
	return n
}
