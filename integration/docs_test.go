package integration

import (
	"go/ast"
	"go/parser"
	"go/token"
	"html"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The tests below keep docs/architecture.md true to the tree: every
// product package is in it, its layers table is tools/archlint's, its
// links resolve, its picture shows every box of its source, and the
// README points to it. They read files only; no process is started.

const (
	repoRoot     = ".."
	archDoc      = "docs/architecture.md"
	archDot      = "docs/architecture.dot"
	archSVG      = "docs/architecture.svg"
	maxArchSVG   = 100 << 10 // plain dot output: no fonts or images embedded
	archlintMain = "tools/archlint/main.go"
)

func readRepoFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

// archlintLayers returns tools/archlint's layers variable, bottom up, read
// from its source (package main cannot be imported).
func archlintLayers(t *testing.T) [][]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(repoRoot, archlintMain), nil, 0)
	if err != nil {
		t.Fatalf("parse %s: %v", archlintMain, err)
	}
	var layers [][]string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "layers" || len(vs.Values) != 1 {
			return true
		}
		outer, ok := vs.Values[0].(*ast.CompositeLit)
		if !ok {
			t.Fatalf("%s: layers is not a composite literal", archlintMain)
		}
		for _, e := range outer.Elts {
			inner, ok := e.(*ast.CompositeLit)
			if !ok {
				t.Fatalf("%s: a layer is not a composite literal", archlintMain)
			}
			var layer []string
			for _, pe := range inner.Elts {
				lit, ok := pe.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("%s: a layer entry is not a string literal", archlintMain)
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatalf("%s: %s: %v", archlintMain, lit.Value, err)
				}
				layer = append(layer, s)
			}
			layers = append(layers, layer)
		}
		return false
	})
	if len(layers) < 5 {
		t.Fatalf("%s: found %d layers in var layers; the test cannot read it", archlintMain, len(layers))
	}
	return layers
}

// mentionsPath reports whether doc names the directory p as code (`p`,
// `p/...`) or links into it (../p/...).
func mentionsPath(doc, p string) bool {
	return strings.Contains(doc, "`"+p+"`") || strings.Contains(doc, "`"+p+"/") || strings.Contains(doc, "../"+p+"/")
}

// productPackages lists the directories holding a product package: every
// directory with non-test Go files, except the testbed, the tests, the
// tools and the deploy/ module.
func productPackages(t *testing.T) []string {
	t.Helper()
	skip := map[string]bool{".git": true, "testbed": true, "integration": true, "tools": true, "deploy": true, "testdata": true, "bin": true}
	seen := map[string]bool{}
	var out []string
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && skip[d.Name()] {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), ".go") || strings.HasSuffix(d.Name(), "_test.go") {
			return nil
		}
		dir, err := filepath.Rel(repoRoot, filepath.Dir(path))
		if err != nil {
			return err
		}
		dir = filepath.ToSlash(dir)
		if dir != "." && !seen[dir] {
			seen[dir] = true
			out = append(out, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", repoRoot, err)
	}
	return out
}

// TestArchitectureListsEveryPackage: every directory named in archlint's
// layers, and every product package under them, appears in the doc.
func TestArchitectureListsEveryPackage(t *testing.T) {
	doc := readRepoFile(t, archDoc)
	for _, layer := range archlintLayers(t) {
		for _, p := range layer {
			if !mentionsPath(doc, p) {
				t.Errorf("%s does not mention %s, a layer of %s", archDoc, p, archlintMain)
			}
		}
	}
	pkgs := productPackages(t)
	if len(pkgs) < 10 {
		t.Fatalf("found only %d product packages under %s: %v", len(pkgs), repoRoot, pkgs)
	}
	for _, p := range pkgs {
		if !mentionsPath(doc, p) {
			t.Errorf("%s does not mention package %s", archDoc, p)
		}
	}
}

// TestArchitectureLayersTable: the doc's layers table has archlint's
// layers, each in its row.
func TestArchitectureLayersTable(t *testing.T) {
	doc := readRepoFile(t, archDoc)
	rows := map[int]string{}
	row := regexp.MustCompile(`(?m)^\| (\d+) \| (.*) \|$`)
	for _, m := range row.FindAllStringSubmatch(doc, -1) {
		n, _ := strconv.Atoi(m[1])
		rows[n] = m[2]
	}
	layers := archlintLayers(t)
	if len(rows) != len(layers) {
		t.Errorf("%s's layers table has %d rows, %s has %d layers", archDoc, len(rows), archlintMain, len(layers))
	}
	for i, layer := range layers {
		r, ok := rows[i]
		if !ok {
			t.Errorf("%s's layers table has no row %d (%v)", archDoc, i, layer)
			continue
		}
		for _, p := range layer {
			if !strings.Contains(r, "`"+p+"`") && !strings.Contains(r, "`"+p+"/") {
				t.Errorf("%s's layers table: row %d (%q) lacks %s", archDoc, i, r, p)
			}
		}
	}
}

// TestArchitectureLinksResolve: every relative link of the doc names a
// file or directory that exists.
func TestArchitectureLinksResolve(t *testing.T) {
	doc := readRepoFile(t, archDoc)
	links := regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(doc, -1)
	if len(links) < 20 {
		t.Fatalf("%s: found only %d links", archDoc, len(links))
	}
	for _, m := range links {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
			continue
		}
		target, _, _ = strings.Cut(target, "#")
		path := filepath.Join(repoRoot, filepath.Dir(archDoc), filepath.FromSlash(target))
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s links to %s, which does not exist: %v", archDoc, m[1], err)
		}
	}
}

// dotLabels returns the lines of every label="..." in a dot source.
func dotLabels(src string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`label\s*=\s*"((?:[^"\\]|\\.)*)"`).FindAllStringSubmatch(src, -1) {
		for _, line := range regexp.MustCompile(`\\[nlr]`).Split(m[1], -1) {
			line = strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(line)
			if line = strings.TrimSpace(line); line != "" {
				out = append(out, line)
			}
		}
	}
	return out
}

// TestArchitectureSVGMatchesDot: the committed SVG exists, is small plain
// dot output, and shows every label line of its source, so that a box
// added to the .dot without `make architecture` fails here.
func TestArchitectureSVGMatchesDot(t *testing.T) {
	doc := readRepoFile(t, archDoc)
	if !strings.Contains(doc, "](architecture.svg)") {
		t.Errorf("%s does not show architecture.svg", archDoc)
	}
	svg := readRepoFile(t, archSVG)
	if len(svg) > maxArchSVG {
		t.Errorf("%s is %d bytes; keep it under %d (plain dot output)", archSVG, len(svg), maxArchSVG)
	}
	if strings.Contains(svg, "<image") || strings.Contains(svg, "@font-face") || strings.Contains(svg, "base64") {
		t.Errorf("%s embeds an image or a font; regenerate it with make architecture", archSVG)
	}
	texts := map[string]bool{}
	for _, m := range regexp.MustCompile(`<text[^>]*>([^<]*)</text>`).FindAllStringSubmatch(svg, -1) {
		texts[strings.TrimSpace(html.UnescapeString(m[1]))] = true
	}
	labels := dotLabels(readRepoFile(t, archDot))
	if len(labels) < 20 {
		t.Fatalf("%s: found only %d label lines", archDot, len(labels))
	}
	for _, l := range labels {
		if !texts[l] {
			t.Errorf("%s lacks %q from %s: run make architecture", archSVG, l, archDot)
		}
	}
}

// TestArchitectureREADMELink: the README points readers to the doc.
func TestArchitectureREADMELink(t *testing.T) {
	if readme := readRepoFile(t, "README.md"); !strings.Contains(readme, "](docs/architecture.md)") {
		t.Errorf("README.md does not link to docs/architecture.md")
	}
}
