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

// Tags that keep the suite's content ids apart.
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

// answerPace is the time an answer is assumed to take per output token
// when the next turn's arrival is placed: a busy engine's decode step.
const answerPace = 20 * time.Millisecond

// SessionsConfig describes multi-turn agent sessions: each starts with
// one of SystemPrompts system prompts (Zipf popularity) and runs a
// geometric number of turns, turn k's prompt being the system prompt,
// every earlier input and answer, and its own input. Sessions start as a
// Poisson process; a turn arrives after the previous answer (OutputLen x
// answerPace) and an exponential think time. Lengths are log-normal
// around their means (sigma 0.8 for turns), the heavy tail of published
// chat and agent traces. Zero fields take their `default` tags.
type SessionsConfig struct {
	Sessions      int           `default:"1200"`
	SystemPrompts int           `default:"32"`
	SystemTokens  int           `default:"2500"` // mean, each prompt's length drawn once
	ZipfS         float64       `default:"1.1"`  // system prompts' popularity
	MeanTurns     float64       `default:"6"`    // geometric, at least 1
	MaxTurns      int           `default:"24"`
	InputTokens   int           `default:"600"` // mean new input: a user message or tool result
	OutputTokens  int           `default:"250"` // mean answer
	ThinkTime     time.Duration `default:"10s"` // mean pause between an answer and the next turn
	SessionRate   float64       `default:"3"`   // sessions started per second
	Engines       int           `default:"8"`   // the fleet the workload is meant for
	Seed          uint64
}

// Sessions generates multi-turn agent sessions.
func Sessions(c SessionsConfig) (*Workload, error) {
	setDefaults(&c)
	if c.Sessions < 0 || c.SystemPrompts <= 0 || c.SystemTokens <= 0 || c.MeanTurns < 1 || c.MaxTurns < 1 ||
		c.InputTokens <= 0 || c.OutputTokens <= 0 || c.ThinkTime < 0 || c.SessionRate <= 0 || c.ZipfS < 0 {
		return nil, fmt.Errorf("workload: sessions: invalid parameters %+v", c)
	}
	rng := rand.New(rand.NewPCG(c.Seed, systemTag))
	system := make([]Segment, c.SystemPrompts)
	for k := range system {
		system[k] = Segment{ID: Mix64(systemTag ^ c.Seed ^ uint64(k)), Len: logNormal(rng, c.SystemTokens, 0.4)}
	}
	cdf := ZipfCDF(c.SystemPrompts, c.ZipfS)
	var reqs []Request
	var start float64
	for s := range c.Sessions {
		start += rng.ExpFloat64() / c.SessionRate
		k := cdf.Pick(rng)
		turns := geometric(rng, c.MeanTurns, c.MaxTurns)
		id := func(tag uint64, turn int) uint64 { return Mix64(tag ^ c.Seed ^ uint64(s)<<20 ^ uint64(turn)) }
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

// ToolAgentsConfig describes tool-calling agents: Catalogs tool catalogs
// (a tool server's JSON schemas) shared by Agents agents (Zipf popularity
// of catalogs), each with its own instructions. Tasks arrive as a Poisson
// process, each for a uniform agent, and loop over steps whose prompt is
// the catalog, the instructions, the task, then every earlier tool call
// and result (tools, system prompt, messages: hosted APIs' prompt-cache
// order); a step's output is the next call, and the next step arrives
// after it (OutputLen x answerPace) and the tool's latency (exponential).
// Zero fields take their `default` tags.
type ToolAgentsConfig struct {
	Tasks         int           `default:"1000"`
	Catalogs      int           `default:"6"`
	CatalogTokens int           `default:"8000"` // mean
	ZipfS         float64       `default:"1.1"`  // catalogs' popularity across agents
	Agents        int           `default:"200"`
	AgentTokens   int           `default:"800"` // mean instructions
	TaskTokens    int           `default:"400"` // mean
	MeanSteps     float64       `default:"5"`   // geometric, at least 1
	MaxSteps      int           `default:"16"`
	CallTokens    int           `default:"80"`  // mean step output: a call or the answer
	ResultTokens  int           `default:"700"` // mean tool result
	ToolTime      time.Duration `default:"2s"`  // a tool call's mean latency
	TaskRate      float64       `default:"3"`   // tasks started per second
	Engines       int           `default:"8"`
	Seed          uint64
}

// ToolAgents generates tool-calling agents.
func ToolAgents(c ToolAgentsConfig) (*Workload, error) {
	setDefaults(&c)
	if c.Tasks < 0 || c.Catalogs <= 0 || c.CatalogTokens <= 0 || c.Agents <= 0 || c.AgentTokens <= 0 || c.TaskTokens <= 0 ||
		c.MeanSteps < 1 || c.MaxSteps < 1 || c.CallTokens <= 0 || c.ResultTokens <= 0 || c.ToolTime < 0 || c.TaskRate <= 0 || c.ZipfS < 0 {
		return nil, fmt.Errorf("workload: tools: invalid parameters %+v", c)
	}
	rng := rand.New(rand.NewPCG(c.Seed, catalogTag))
	catalogs := make([]Segment, c.Catalogs)
	for k := range catalogs {
		catalogs[k] = Segment{ID: Mix64(catalogTag ^ c.Seed ^ uint64(k)), Len: logNormal(rng, c.CatalogTokens, 0.4)}
	}
	cdf := ZipfCDF(c.Catalogs, c.ZipfS)
	agentCatalog := make([]int, c.Agents)
	agents := make([]Segment, c.Agents)
	for a := range agents {
		agentCatalog[a] = cdf.Pick(rng)
		agents[a] = Segment{ID: Mix64(agentTag ^ c.Seed ^ uint64(a)), Len: logNormal(rng, c.AgentTokens, 0.5)}
	}
	var reqs []Request
	var start float64
	for task := range c.Tasks {
		start += rng.ExpFloat64() / c.TaskRate
		a := rng.IntN(c.Agents)
		id := func(tag uint64, step int) uint64 { return Mix64(tag ^ c.Seed ^ uint64(task)<<20 ^ uint64(step)) }
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
// each add the previous step's output (answer, repeating step k's n
// tokens) and a new input (none at step 0 when first is set).
type conversation struct {
	prefix []Segment
	start  float64 // seconds
	steps  int
	group  string
	input  func(k int) Segment
	output func(k int) int
	answer func(k, n int) Segment
	think  time.Duration
	first  bool
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

// sortedWorkload sorts reqs stably by arrival and numbers them.
func sortedWorkload(name string, engines int, reqs []Request) *Workload {
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	for i := range reqs {
		reqs[i].ID = i
	}
	return &Workload{Name: name, Engines: engines, Requests: reqs}
}

// RAGConfig describes retrieval-augmented generation: a shared system
// prompt, Retrieved documents and the question. Questions fall into
// Topics topics (Zipf popularity), each with TopicDocs relevant documents
// of one corpus in a fixed order; a request retrieves the Retrieved best
// after Gaussian noise of Noise ranks on their scores, so documents recur
// in varying subsets and orders, across topics too. Documents are
// chunk-sized (within 25% of DocTokens); arrivals Poisson at QPS. Zero
// fields take their `default` tags.
type RAGConfig struct {
	Requests     int     `default:"8000"`
	Documents    int     `default:"3000"` // corpus
	DocTokens    int     `default:"600"`  // mean
	Topics       int     `default:"400"`
	TopicDocs    int     `default:"10"`
	Retrieved    int     `default:"5"`
	Noise        float64 // score noise in ranks (1 when 0, unless Exact)
	Exact        bool    // no noise: Noise must be 0
	ZipfS        float64 `default:"1.1"` // topics' popularity
	SystemTokens int     `default:"400"`
	QueryTokens  int     `default:"80"`  // mean
	OutputTokens int     `default:"200"` // mean
	QPS          float64 `default:"16"`
	Engines      int     `default:"8"`
	Seed         uint64
}

// RAG generates the retrieval-augmented workload.
func RAG(c RAGConfig) (*Workload, error) {
	if c.Exact && c.Noise != 0 {
		return nil, fmt.Errorf("workload: rag: an exact retriever with noise %v", c.Noise)
	}
	setDefaults(&c)
	if c.Noise == 0 && !c.Exact {
		c.Noise = 1
	}
	if c.Requests < 0 || c.Documents <= 0 || c.DocTokens <= 0 || c.Topics <= 0 || c.TopicDocs <= 0 || c.Retrieved <= 0 ||
		c.Retrieved > c.TopicDocs || c.TopicDocs > c.Documents || c.Noise < 0 || c.SystemTokens <= 0 || c.QueryTokens <= 0 ||
		c.OutputTokens <= 0 || c.QPS <= 0 || c.ZipfS < 0 {
		return nil, fmt.Errorf("workload: rag: invalid parameters %+v", c)
	}
	rng := rand.New(rand.NewPCG(c.Seed, ragTag))
	docs := make([]Segment, c.Documents)
	for d := range docs {
		docs[d] = Segment{ID: Mix64(docTag ^ c.Seed ^ uint64(d)), Len: max(1, int(float64(c.DocTokens)*(0.75+0.5*rng.Float64())))}
	}
	topics := make([][]int, c.Topics)
	for t := range topics {
		topics[t] = rng.Perm(c.Documents)[:c.TopicDocs]
	}
	system := Segment{ID: Mix64(systemTag ^ ragTag ^ c.Seed), Len: c.SystemTokens}
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
		segs = append(segs, Segment{ID: Mix64(queryTag ^ ragTag ^ c.Seed ^ uint64(i)<<8), Len: logNormal(rng, c.QueryTokens, 0.6)})
		w.Requests[i] = newRequest(i, t, segs, logNormal(rng, c.OutputTokens, 0.6), "topic-"+strconv.Itoa(topic))
	}
	return w, nil
}

// logNormal draws a log-normal length of mean and sigma (the normal's),
// within [1, 8*mean].
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
