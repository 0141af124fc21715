// Command archlint checks that kvindex's tree is its architecture: every
// product package imports only layers below its own (never one above it,
// nor a sibling of its layer), no product package imports the testbed,
// the shipped binaries link neither the testbed nor nats-server, and no
// non-generated file or function outgrows its budget (files 800 lines,
// functions 120 outside tests), and the tree's non-test, non-generated Go
// lines (clients/ aside) stay within ratchet.txt's "total" line. It reads the import graph from `go list`,
// so it sees exactly what the compiler sees. Run from the repository
// root: `go -C tools run ./archlint ..` (make lint does).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

const module = "github.com/kvindex/kvindex"

// layers lists the product's packages bottom up: a package may import a
// package of a lower layer, and its own subtree, and nothing else of the
// module. A package belongs to the longest prefix listed.
var layers = [][]string{
	{"internal", "proto"}, // leaf helpers and the generated contract
	{"events"},            // the event model and its codecs
	{"events/zmq", "events/natsbus"},
	{"indexer"},
	{"scoring", "metrics"},
	{"scoring/scrape", "tokenize"},
	{"api"},
	{"config"},
	{"fleet", "picker", "discovery", "ctl"},
	{"daemon"},
	{"cmd"},
}

// Budgets (STYLE.md: a file is one job; a function needing a scroll hides
// a step). ratchet.txt lists what exceeds them today; it may only shrink.
const (
	maxFileLines = 800
	maxFuncLines = 120
)

// binaries are the shipped commands and what they must never link.
var binaries = map[string][]string{
	"cmd/kvindex":    {module + "/testbed", "github.com/nats-io/nats-server"},
	"cmd/kvindexctl": {module + "/testbed", "github.com/nats-io/nats-server"},
}

type pkg struct {
	ImportPath string
	Dir        string
	Imports    []string
	Deps       []string
	GoFiles    []string
}

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	var problems []string
	pkgs, err := list(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "archlint:", err)
		os.Exit(2)
	}
	for _, p := range pkgs {
		problems = append(problems, checkImports(p)...)
		if deny, ok := binaries[rel(p.ImportPath)]; ok {
			for _, d := range p.Deps {
				for _, x := range deny {
					if d == x || strings.HasPrefix(d, x+"/") {
						problems = append(problems, fmt.Sprintf("%s links %s", rel(p.ImportPath), d))
					}
				}
			}
		}
	}
	ratchet := readRatchet(filepath.Join(root, "tools/archlint/ratchet.txt"))
	problems = append(problems, checkSizes(root, ratchet)...)
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		fmt.Printf("archlint: %d problems\n", len(problems))
		os.Exit(1)
	}
}

func list(root string) ([]pkg, error) {
	cmd := exec.Command("go", "list", "-deps=false", "-json", "./...")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		if _, ok := binaries[rel(p.ImportPath)]; ok {
			deps, err := exec.Command("go", "list", "-C", root, "-deps", "./"+rel(p.ImportPath)).Output()
			if err != nil {
				return nil, fmt.Errorf("go list -deps %s: %w", p.ImportPath, err)
			}
			p.Deps = strings.Fields(string(deps))
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

func rel(path string) string { return strings.TrimPrefix(strings.TrimPrefix(path, module), "/") }

// layerOf is the index in layers of path's longest listed prefix, -1 for
// the testbed and tests (integration), -2 for an unlisted package.
func layerOf(path string) (int, string) {
	if path == "testbed" || strings.HasPrefix(path, "testbed/") || path == "integration" || strings.HasPrefix(path, "tools/") {
		return -1, "testbed"
	}
	best, bestPrefix := -2, ""
	for i, l := range layers {
		for _, prefix := range l {
			if (path == prefix || strings.HasPrefix(path, prefix+"/")) && len(prefix) > len(bestPrefix) {
				best, bestPrefix = i, prefix
			}
		}
	}
	return best, bestPrefix
}

func checkImports(p pkg) []string {
	from := rel(p.ImportPath)
	fl, fprefix := layerOf(from)
	if fl == -2 {
		return []string{fmt.Sprintf("%s: in no layer (add it to tools/archlint's layers)", from)}
	}
	var out []string
	for _, imp := range p.Imports {
		if !strings.HasPrefix(imp, module+"/") {
			continue
		}
		to := rel(imp)
		tl, tprefix := layerOf(to)
		switch {
		case tl == -1 && fl != -1:
			out = append(out, fmt.Sprintf("%s imports the testbed's %s", from, to))
		case fl == -1 || tl == -2:
		case strings.HasPrefix(to, from+"/") || strings.HasPrefix(from, tprefix+"/") || tprefix == fprefix:
			// its own subtree, or its parent's: one package tree
		case tl > fl:
			out = append(out, fmt.Sprintf("%s imports %s: upward (layer %d -> %d)", from, to, fl, tl))
		case tl == fl:
			out = append(out, fmt.Sprintf("%s imports %s: sideways (both layer %d)", from, to, fl))
		}
	}
	return out
}

// generated matches Go's marker of a generated file (go help generate).
var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

// totalBudget is ratchet's "total N" line: the most non-test,
// non-generated Go lines the tree may hold (0 lines if it has none).
func totalBudget(ratchet map[string]bool) int {
	for k := range ratchet {
		if n, ok := strings.CutPrefix(k, "total "); ok {
			if v, err := strconv.Atoi(n); err == nil {
				return v
			}
		}
	}
	return 0
}

func readRatchet(path string) map[string]bool {
	m := map[string]bool{}
	f, err := os.Open(path)
	if err != nil {
		return m
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if line := strings.TrimSpace(s.Text()); line != "" && !strings.HasPrefix(line, "#") {
			m[line] = true
		}
	}
	return m
}

// checkSizes reports files and functions over budget that ratchet does not
// list, and ratchet entries that no longer exceed it (so the list shrinks).
func checkSizes(root string, ratchet map[string]bool) []string {
	var out []string
	seen := map[string]bool{}
	total := 0
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && (name == ".git" || name == "tools" || name == "deploy" || name == "testdata") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".pb.go") {
			return nil
		}
		r, _ := filepath.Rel(root, path)
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		test := strings.HasSuffix(name, "_test.go")
		n := bytes.Count(src, []byte("\n"))
		if !test && !generated.Match(src) && !strings.HasPrefix(r, "clients"+string(filepath.Separator)) {
			total += n
		}
		if n > maxFileLines && !test {
			key := "file " + r
			seen[key] = true
			if !ratchet[key] {
				out = append(out, fmt.Sprintf("%s: %d lines (budget %d)", r, n, maxFileLines))
			}
		}
		if test {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if n <= maxFuncLines {
				continue
			}
			key := "func " + r + " " + fn.Name.Name
			seen[key] = true
			if !ratchet[key] {
				out = append(out, fmt.Sprintf("%s: func %s: %d lines (budget %d)", r, fn.Name.Name, n, maxFuncLines))
			}
		}
		return nil
	})
	if budget := totalBudget(ratchet); total > budget {
		out = append(out, fmt.Sprintf("%d non-test, non-generated Go lines, over the budget of %d (ratchet.txt)", total, budget))
	}
	for k := range ratchet {
		if strings.HasPrefix(k, "total ") {
			continue
		}
		if !seen[k] {
			out = append(out, fmt.Sprintf("tools/archlint/ratchet.txt: %q is within budget now: remove it", k))
		}
	}
	return out
}
