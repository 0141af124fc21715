package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// readmeImports are the packages a README Go snippet that is a statement
// list may use, by the name it uses them under; the test imports each one
// whose name the snippet uses as a selector.
var readmeImports = map[string]string{
	"context":   "context",
	"fmt":       "fmt",
	"log":       "log",
	"time":      "time",
	"api":       "github.com/kvindex/kvindex/api",
	"events":    "github.com/kvindex/kvindex/events",
	"indexer":   "github.com/kvindex/kvindex/indexer",
	"scoring":   "github.com/kvindex/kvindex/scoring",
	"kvindexv1": "github.com/kvindex/kvindex/proto/kvindex/v1",
}

// goBlock is one ```go block of README.md.
type goBlock struct {
	line int // README line of the block's first line of code
	code string
}

// readmeGoBlocks returns every ```go block of the README at path.
func readmeGoBlocks(t *testing.T, path string) []goBlock {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []goBlock
	var cur *goBlock
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && strings.TrimSpace(l) == "```go":
			cur = &goBlock{line: i + 2}
		case cur != nil && strings.TrimSpace(l) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.code += l + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: a ```go block is never closed", path, cur.line-1)
	}
	return out
}

// snippetFile returns the block as a Go file of package main: as it is
// when it is a whole file, else its statements as main's body with the
// readmeImports it uses. A //line directive makes compile errors name the
// README's lines.
func snippetFile(b goBlock) string {
	directive := fmt.Sprintf("//line README.md:%d\n", b.line)
	if strings.HasPrefix(strings.TrimSpace(b.code), "package ") {
		return directive + b.code
	}
	var imports []string
	for name, path := range readmeImports {
		if regexp.MustCompile(`\b` + name + `\.`).MatchString(b.code) {
			imports = append(imports, fmt.Sprintf("\t%s %q\n", name, path))
		}
	}
	slices.Sort(imports)
	return "package main\n\nimport (\n" + strings.Join(imports, "") + ")\n\nfunc main() {\n" + directive + b.code + "}\n"
}

// TestReadmeGoSnippetsCompile: every ```go block of README.md compiles
// against the packages in this tree, so the README's Go never
// drifts from the API. Each block is a package of its own, laid over the
// module with go's -overlay (nothing is written into the tree). A block is
// either a whole file or a statement list, run as main's body with the
// packages of readmeImports it names.
func TestReadmeGoSnippetsCompile(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to compile the README's snippets: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeGoBlocks(t, filepath.Join(root, "README.md"))
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```go block: the client example is gone")
	}
	dir := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	for i, b := range blocks {
		src := filepath.Join(dir, fmt.Sprintf("snippet%d.go", i))
		if err := os.WriteFile(src, []byte(snippetFile(b)), 0o644); err != nil {
			t.Fatal(err)
		}
		pkg := fmt.Sprintf("./internal/readmesnippet/line%d", b.line)
		overlay[filepath.Join(root, pkg, "main.go")] = src
		pkgs = append(pkgs, pkg)
	}
	ov, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ovPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovPath, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	// go build, not go vet: vet runs in each package's directory, which
	// exists only in the overlay.
	cmd := exec.CommandContext(t.Context(), goTool, append([]string{"build", "-overlay", ovPath, "-o", os.DevNull}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README.md's Go does not compile against this tree (%v):\n%s", err, out)
	}
}
