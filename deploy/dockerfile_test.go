package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the repository root, the parent of this module.
const root = ".."

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// makeRecipe returns the commands of target's recipe in the Makefile,
// with $(GO) as go.
func makeRecipe(t *testing.T, target string) []string {
	t.Helper()
	var out []string
	in := false
	for _, l := range strings.Split(readFile(t, "Makefile"), "\n") {
		switch {
		case strings.HasPrefix(l, target+":"):
			in = true
		case in && strings.HasPrefix(l, "\t"):
			out = append(out, strings.ReplaceAll(strings.TrimSpace(l), "$(GO)", "go"))
		case in:
			return out
		}
	}
	if len(out) == 0 {
		t.Fatalf("Makefile has no recipe for %s", target)
	}
	return out
}

// dockerRuns returns the Dockerfile's RUN commands of stage, in order.
func dockerRuns(t *testing.T, stage string) []string {
	t.Helper()
	var out []string
	cur := ""
	text := strings.ReplaceAll(readFile(t, "Dockerfile"), "\\\n", " ")
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			cur = ""
			if i := slices.Index(f, "AS"); i > 0 && i+1 < len(f) {
				cur = f[i+1]
			}
		case "RUN":
			if cur == stage {
				out = append(out, strings.Join(f[1:], " "))
			}
		}
	}
	return out
}

// TestDockerfileBuildsAsMake: the images' build commands are `make
// build`'s, their Go is go.mod's, the build installs what scripts/deps.sh
// installs, and both images are slim and non-root: the production image
// (the default target) holds kvindex and kvindexctl with a gRPC health
// check, the testbed image every testbed binary and kvindexctl.
func TestDockerfileBuildsAsMake(t *testing.T) {
	recipe := makeRecipe(t, "build")
	want := []string{"go build -trimpath -ldflags=-s -o bin/ ./cmd/...", "go build -trimpath -ldflags=-s -o bin/ ./testbed/cmd/..."}
	if !slices.Equal(recipe, want) {
		t.Fatalf("make build runs %q, want %q", recipe, want)
	}
	for i, stage := range []string{"build", "build-testbed"} {
		if runs := dockerRuns(t, stage); len(runs) == 0 || runs[len(runs)-1] != recipe[i] {
			t.Errorf("the Dockerfile's stage %s ends with %q, make build runs %q", stage, runs, recipe[i])
		}
	}

	df := readFile(t, "Dockerfile")
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(readFile(t, "go.mod"))
	if tc := regexp.MustCompile(`(?m)^toolchain go(\S+)$`).FindStringSubmatch(readFile(t, "go.mod")); tc != nil {
		goVersion = tc
	}
	if goVersion == nil || !strings.Contains(df, "ARG GO_VERSION="+goVersion[1]+"\n") || !strings.Contains(df, "FROM golang:${GO_VERSION}-") {
		t.Fatalf("the Dockerfile does not pin Go %v (go.mod's)", goVersion)
	}
	runs := dockerRuns(t, "build")
	for _, pkg := range regexp.MustCompile(`missing\+=\(([^)]*)\)`).FindAllStringSubmatch(readFile(t, "scripts/deps.sh"), -1) {
		for _, p := range strings.Fields(pkg[1]) {
			switch p {
			case "gcc", "libc6-dev": // in the golang image
				continue
			case "prometheus", "protobuf-compiler", "protobuf-compiler-grpc", "openssl", "python3", "python3-grpcio",
				"python3-protobuf", "python3-setuptools", "python3-venv", "python3-pip":
				continue // the tests' and make proto's only (scripts/deps.sh test)
			}
			if !strings.Contains(strings.Join(runs, "\n"), p) {
				t.Errorf("scripts/deps.sh installs %s; the Dockerfile's build stage does not", p)
			}
		}
	}
	for _, want := range []string{
		"FROM debian:${DEBIAN_RELEASE}-slim AS runtime",
		"libzmq5",
		"USER 65532:65532",
		"FROM runtime AS testbed",
		`CMD ["kvindexctl", "--addr", "127.0.0.1:50051", "--timeout", "3s", "health"]`,
		`ENTRYPOINT ["kvindex"]`,
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	// The last stage is the default target: the production image.
	last := df[strings.LastIndex(df, "\nFROM "):]
	if !strings.HasPrefix(last, "\nFROM runtime AS production\n") || !strings.Contains(last, "HEALTHCHECK") {
		t.Errorf("the Dockerfile's last stage is not the production image with a health check:%s", last)
	}
	copies := func(stage string) []string {
		i := strings.Index(df, "AS "+stage+"\n")
		m := regexp.MustCompile(`(?m)^COPY --from=\S+ (.*) /usr/local/bin/$`).FindStringSubmatch(df[i:])
		if i < 0 || m == nil {
			t.Fatalf("stage %s copies no binaries", stage)
		}
		return strings.Fields(strings.ReplaceAll(m[1], "/src/bin/", ""))
	}
	if got := copies("production"); !slices.Equal(got, []string{"kvindex", "kvindexctl"}) {
		t.Errorf("the production image holds %q, want kvindex and kvindexctl only", got)
	}
	// Every directory of testbed/cmd is a main package the testbed image holds.
	testbed := copies("testbed")
	ents, err := os.ReadDir(filepath.Join(root, "testbed/cmd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() && (!strings.Contains(readFile(t, filepath.Join("testbed/cmd", e.Name(), "main.go")), "package main") || !slices.Contains(testbed, e.Name())) {
			t.Errorf("testbed/cmd/%s: not a main package the testbed image holds (%q)", e.Name(), testbed)
		}
	}
	if !slices.Contains(testbed, "kvindexctl") {
		t.Error("the testbed image lacks kvindexctl, its engines' health check")
	}
	ignore := strings.Fields(readFile(t, ".dockerignore"))
	for _, want := range []string{".git", "bin", "deploy"} {
		if !slices.Contains(ignore, want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
}

// TestGoVersionDocumented: the README and scripts/deps.sh ask for the Go
// that go.mod's go line requires, no older.
func TestGoVersionDocumented(t *testing.T) {
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(readFile(t, "go.mod"))
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	want := "Go " + m[1] + " or newer"
	for _, f := range []string{"README.md", "scripts/deps.sh"} {
		text := readFile(t, f)
		if !strings.Contains(text, want) {
			t.Errorf("%s does not say %q", f, want)
		}
		for _, v := range regexp.MustCompile(`Go (1\.\d+(?:\.\d+)?)(\+| or newer)`).FindAllStringSubmatch(text, -1) {
			if v[1] != m[1] {
				t.Errorf("%s asks for %q; go.mod requires %s", f, v[0], m[1])
			}
		}
	}
}
