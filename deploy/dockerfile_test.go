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

// TestDockerfileBuildsAsMake: the image's build command is `make build`'s,
// its Go is go.mod's, it installs what scripts/deps.sh installs, and the
// runtime stage is slim, non-root, has libzmq, every binary and a gRPC
// health check.
func TestDockerfileBuildsAsMake(t *testing.T) {
	recipe := makeRecipe(t, "build")
	if len(recipe) != 1 {
		t.Fatalf("make build has %d commands, the Dockerfile one: %q", len(recipe), recipe)
	}
	runs := dockerRuns(t, "build")
	if len(runs) == 0 || runs[len(runs)-1] != recipe[0] {
		t.Fatalf("the Dockerfile's last build step is %q, make build runs %q", runs[len(runs)-1], recipe[0])
	}
	if !strings.Contains(recipe[0], "./cmd/...") || !strings.Contains(recipe[0], "./testbed/cmd/...") {
		t.Fatalf("make build (%q) does not build every binary under cmd/ and testbed/cmd/", recipe[0])
	}

	df := readFile(t, "Dockerfile")
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(readFile(t, "go.mod"))
	if tc := regexp.MustCompile(`(?m)^toolchain go(\S+)$`).FindStringSubmatch(readFile(t, "go.mod")); tc != nil {
		goVersion = tc
	}
	if goVersion == nil || !strings.Contains(df, "ARG GO_VERSION="+goVersion[1]+"\n") || !strings.Contains(df, "FROM golang:${GO_VERSION}-") {
		t.Fatalf("the Dockerfile does not pin Go %v (go.mod's)", goVersion)
	}
	deps := readFile(t, "scripts/deps.sh")
	for _, pkg := range regexp.MustCompile(`missing\+=\(([^)]*)\)`).FindAllStringSubmatch(deps, -1) {
		for _, p := range strings.Fields(pkg[1]) {
			switch p {
			case "gcc", "libc6-dev": // in the golang image
				continue
			case "prometheus": // promtool, for the tests only
				continue
			case "protobuf-compiler", "protobuf-compiler-grpc", "python3", "python3-grpcio", "python3-protobuf", "openssl":
				continue // make proto's Python generator and the Python client's tests only
			}
			if !strings.Contains(strings.Join(runs, "\n"), p) {
				t.Errorf("scripts/deps.sh installs %s; the Dockerfile's build stage does not", p)
			}
		}
	}
	for _, want := range []string{
		"FROM debian:${DEBIAN_RELEASE}-slim",
		"libzmq5",
		"COPY --from=build /src/bin/ /usr/local/bin/",
		"USER 65532:65532",
		`CMD ["kvindexctl", "--addr", "127.0.0.1:50051", "--timeout", "3s", "health"]`,
		`ENTRYPOINT ["kvindex"]`,
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if !strings.Contains(df, "HEALTHCHECK") {
		t.Error("Dockerfile has no HEALTHCHECK")
	}
	// Every binary: bin/ is copied whole, and every directory of cmd/ and
	// testbed/cmd/ is a main package that make build builds.
	for _, dir := range []string{"cmd", "testbed/cmd"} {
		ents, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.IsDir() && !strings.Contains(readFile(t, filepath.Join(dir, e.Name(), "main.go")), "package main") {
				t.Errorf("%s/%s is not a main package", dir, e.Name())
			}
		}
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
