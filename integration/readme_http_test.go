package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/config"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// readmeHTTPModel and readmeHTTPTokens are the model and the prompt of
// the README's curl commands.
const readmeHTTPModel = "meta-llama/Llama-3.1-8B-Instruct"

var readmeHTTPTokens = []uint32{128000, 882, 1202, 374, 3938, 311, 279, 1888, 13, 578, 4320, 374, 220, 2983, 13, 128001}

// readmeSection returns the first ```sh block after the README heading
// title.
func readmeSection(t *testing.T, title string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n"+title+"\n")
	if !ok {
		t.Fatalf("README.md has no %q section", title)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	block, _, closed := strings.Cut(rest, "```\n")
	if !ok || !closed {
		t.Fatalf("README.md's %q section has no ```sh block", title)
	}
	return block
}

// TestReadmeHTTPJSON runs the README's curl commands (section "HTTP/JSON
// (curl)") against a daemon with http_listen and auth on, one simulated
// engine holding the prompt: Score finds it, Route picks its pod, Release
// releases, ListWorkers lists it, each answer protojson. With a read-only
// token the commands stop at Route (403), and a request without a model
// is 400 naming the field, as the README says.
func TestReadmeHTTPJSON(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("curl is needed to run the README's commands: %v", err)
	}
	block := readmeSection(t, "### HTTP/JSON (curl)")
	t.Setenv("KVINDEX_TEST_HTTP_ROUTE", "route-secret")
	t.Setenv("KVINDEX_TEST_HTTP_READ", "read-secret")
	f := newFleet(t, fleetOptions{configure: func(c *config.Config) {
		c.HTTPListen = "127.0.0.1:0"
		c.Models = append(c.Models, config.Model{Name: readmeHTTPModel, BlockSize: blockSize})
		c.Auth.Tokens = []config.Token{
			{Name: "router", Scopes: []string{"read", "route"}, Env: "KVINDEX_TEST_HTTP_ROUTE"},
			{Name: "scripts", Scopes: []string{"read"}, Env: "KVINDEX_TEST_HTTP_READ"},
		}
	}}, podSpec{name: "vllm-0", model: readmeHTTPModel})
	f.start()
	ev, _ := (&engine{}).store(0, readmeHTTPTokens)
	f.publish("vllm-0", 0, ev)
	base := "http://" + f.d.HTTPAddr()
	block = strings.ReplaceAll(block, "http://localhost:8080", base)

	run := func(token string) (string, error) {
		cmd := exec.Command("sh", "-ec", block)
		cmd.Env = append(os.Environ(), "KVINDEX_TOKEN="+token)
		out, err := cmd.Output()
		return string(out), err
	}
	out, err := run("route-secret")
	if err != nil {
		t.Fatalf("README commands: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("README commands printed %d lines, want 4 answers:\n%s", len(lines), out)
	}
	var (
		score   kvindexv1.ScoreResponse
		routed  kvindexv1.RouteResponse
		release kvindexv1.ReleaseResponse
		list    kvindexv1.ListWorkersResponse
	)
	for i, m := range []proto.Message{&score, &routed, &release, &list} {
		if err := protojson.Unmarshal([]byte(lines[i]), m); err != nil {
			t.Fatalf("answer %d %s: %v", i, lines[i], err)
		}
	}
	if w := score.GetWorkers(); len(w) != 1 || w[0].GetWorker().GetPod() != "vllm-0" || w[0].GetMatchedBlocks() != 1 || score.GetPromptBlocks() != 1 {
		t.Errorf("Score: %s, want vllm-0 holding the prompt's 1 block", lines[0])
	}
	if routed.GetChosen().GetPod() != "vllm-0" || !release.GetReleased() {
		t.Errorf("Route, Release: %s, %s; want vllm-0 chosen and req-1 released", lines[1], lines[2])
	}
	if w := list.GetWorkers(); len(w) != 1 || w[0].GetResidentBlocks() != 1 {
		t.Errorf("ListWorkers: %s, want vllm-0 with 1 block", lines[3])
	}

	out, err = run("read-secret")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); err == nil || len(lines) != 2 || !strings.Contains(lines[1], `"code":"permission_denied"`) {
		t.Errorf("README commands with a read-only token: %v\n%s\nwant Score answered, then Route refused permission_denied", err, out)
	}

	req, _ := http.NewRequest(http.MethodPost, base+"/kvindex.v1.IndexService/Score", strings.NewReader(`{"token_ids": [1]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer read-secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct{ Code, Message string }
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != http.StatusBadRequest || e.Code != "invalid_argument" || e.Message != "model: required" {
		t.Errorf("Score without a model: %d %+v (%v), want 400 invalid_argument \"model: required\"", resp.StatusCode, e, err)
	}
}
