package lint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// modulePath is the main module. Patterns in the rules below are relative to
// it unless they start with a domain (contain a dot before the first slash).
const modulePath = "github.com/shale-db/shale"

// importRule constrains what a set of packages may depend on, directly or
// transitively, in production code and in tests.
//
// A package matching one of from (and none of fromExcept) may not depend on
// any package matching deny. If allow is non-nil, it may in addition depend
// on no package of the main module except those matching allow (standard
// library and third-party packages are not restricted by allow).
//
// Patterns are import paths; "x/..." matches x and everything below it.
type importRule struct {
	name       string
	from       []string
	fromExcept []string
	allow      []string
	deny       []string
	// testAllow are extra packages the rule's packages may reach from their
	// tests only (for example, a real cluster for runnable examples).
	testAllow []string
}

// upperLayers are the layers above storage and the side packages that the
// storage engine must stay independent of (docs/architecture.md, "Import direction").
var upperLayers = []string{
	"server/...", "placement/...", "replication/...", "client/...",
	"cmd/...", "chaos/...", "bench/...", "proto/...",
}

// importRules is the import direction of docs/architecture.md, one row per constraint. A rule
// whose from-packages do not exist yet passes vacuously.
var importRules = []importRule{
	{
		name: "storage is a self-contained library: it imports no layer above it",
		from: []string{"storage/..."},
		deny: upperLayers,
	},
	{
		name: "storage leaf packages never import the storage root package",
		from: []string{
			"storage/vfs/...", "storage/wal/...", "storage/sstable/...",
			"storage/memtable/...", "storage/manifest/...", "storage/cache/...",
			"storage/internal/...",
		},
		deny: []string{"storage"},
	},
	{
		name:  "proto imports nothing of ours",
		from:  []string{"proto/..."},
		allow: []string{"proto/..."},
	},
	{
		name:  "client depends only on proto and the TLS files package (its tests may start a real cluster)",
		from:  []string{"client/..."},
		allow: []string{"client/...", "proto/...", "security/tlsconfig"},
		testAllow: []string{
			"internal/testcluster", "internal/freeport", "internal/parallel", "internal/directfile", "internal/filecrc", "server/...", "placement/...", "replication/...", "storage/...", "backup/...", "security/...",
		},
	},
	{
		name:  "backup depends only on proto and the founding layout of placement (the server restores from it; its tests may start a real cluster)",
		from:  []string{"backup/..."},
		allow: []string{"backup/...", "proto/...", "placement", "internal/parallel", "internal/directfile", "internal/filecrc"},
		testAllow: []string{
			"client/...", "internal/testcluster", "internal/freeport", "internal/s3test", "server/...", "placement/...", "replication/...", "storage/...", "security/...",
		},
	},
	{
		name:  "internal/s3test imports only internal/freeport",
		from:  []string{"internal/s3test"},
		allow: []string{"internal/s3test", "internal/freeport"},
	},
	{
		name:  "replication depends only on storage and proto (its tests may use the network faults)",
		from:  []string{"replication/..."},
		allow: []string{"replication/...", "storage/...", "proto/...", "internal/directfile", "internal/filecrc"},
		// internal/netfault imports nothing of ours.
		testAllow: []string{"internal/netfault"},
	},
	{
		name:  "internal/netfault imports nothing of ours",
		from:  []string{"internal/netfault"},
		allow: []string{"internal/netfault"},
	},
	{
		name:  "security imports nothing of ours (the SDK, the server and the tools share it)",
		from:  []string{"security/..."},
		allow: []string{"security/..."},
	},
	{
		name:  "internal/freeport imports nothing of ours",
		from:  []string{"internal/freeport"},
		allow: []string{"internal/freeport"},
	},
	{
		name:  "internal/parallel imports nothing of ours",
		from:  []string{"internal/parallel"},
		allow: []string{"internal/parallel"},
	},
	{
		name:  "internal/directfile imports nothing of ours",
		from:  []string{"internal/directfile"},
		allow: []string{"internal/directfile"},
	},
	{
		name:  "internal/filecrc imports nothing of ours",
		from:  []string{"internal/filecrc"},
		allow: []string{"internal/filecrc"},
	},
	{
		name:  "internal/logring imports nothing of ours",
		from:  []string{"internal/logring"},
		allow: []string{"internal/logring"},
	},
	{
		name:  "placement depends only on replication, storage and proto",
		from:  []string{"placement/..."},
		allow: []string{"placement/...", "replication/...", "storage/...", "proto/..."},
	},
	{
		name: "server does not import the binaries or the test harnesses",
		from: []string{"server/..."},
		deny: []string{"cmd/...", "chaos/...", "bench/..."},
	},
	{
		name:       "nothing imports cmd/ (binaries are the top of the graph)",
		from:       []string{"..."},
		fromExcept: []string{"cmd/..."},
		deny:       []string{"cmd/..."},
	},
	{
		name: "benchmark peers live only in bench/ (its own module), never in the main module",
		from: []string{"..."},
		deny: []string{
			"github.com/cockroachdb/pebble/...",
			"github.com/syndtr/goleveldb/...",
			"go.etcd.io/etcd/server/...",
		},
	},
}

// TestImportDirection checks importRules against the import graph reported
// by `go list -deps -test`, so test-only imports count too.
func TestImportDirection(t *testing.T) {
	g := loadGraph(t)

	for _, r := range importRules {
		t.Run(r.name, func(t *testing.T) {
			var violations []string
			seen := map[string]bool{}
			checked := 0
			for _, id := range g.ours {
				owner := g.owner[id]
				if !matchAny(owner, r.from) || matchAny(owner, r.fromExcept) {
					continue
				}
				checked++
				parent := g.reach(id)
				for dep := range parent {
					path := stripVariant(dep)
					if path == owner || !r.forbids(path) {
						continue
					}
					if strings.Contains(id, " [") && matchAny(path, r.testAllow) {
						continue
					}
					key := owner + " -> " + path
					if seen[key] {
						continue
					}
					seen[key] = true
					how := "directly"
					if chain := g.chain(parent, dep); strings.Count(chain, " -> ") > 1 {
						how = "via " + chain
					}
					violations = append(violations, fmt.Sprintf("%s%s imports %s %s",
						rel(owner), testSuffix(id), rel(path), how))
				}
			}
			if checked == 0 {
				t.Logf("no packages match %v yet; rule holds vacuously", r.from)
				return
			}
			sort.Strings(violations)
			for _, v := range violations {
				t.Errorf("%s", v)
			}
		})
	}
}

func (r importRule) forbids(path string) bool {
	if matchAny(path, r.deny) {
		return true
	}
	return r.allow != nil && inModule(path) && !matchAny(path, r.allow)
}

// goPackage is the subset of `go list -json` output the checks use.
type goPackage struct {
	ImportPath string
	Name       string
	ForTest    string
	Imports    []string
	Error      *struct{ Err string }
}

// importGraph is the import graph of the main module's packages, their test
// variants, and everything they depend on. Nodes are go list IDs such as
// "p", "p [p.test]" (p compiled with its tests) and "p_test [p.test]".
type importGraph struct {
	imports map[string][]string
	owner   map[string]string // node -> the package of ours it belongs to
	ours    []string          // nodes of the main module, sorted
}

func loadGraph(t *testing.T) *importGraph {
	t.Helper()
	out := goCmd(t, "list", "-e", "-deps", "-test", "-json", "./...")
	g := &importGraph{imports: map[string][]string{}, owner: map[string]string{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		id := p.ImportPath
		g.imports[id] = p.Imports
		path := stripVariant(id)
		if p.ForTest != "" {
			path = p.ForTest
		}
		// Skip the synthesized test main packages ("p.test").
		if !inModule(path) || (p.Name == "main" && strings.HasSuffix(id, ".test")) {
			continue
		}
		g.owner[id] = path
		g.ours = append(g.ours, id)
		if p.Error != nil {
			// Build errors are go vet's and the compiler's business; the
			// import graph of the package is still checked as far as known.
			t.Logf("go list: %s: %s", id, p.Error.Err)
		}
	}
	sort.Strings(g.ours)
	if len(g.ours) == 0 {
		t.Fatalf("go list found no packages of %s; is the test running inside the module?", modulePath)
	}
	return g
}

// reach returns every node reachable from id (id excluded), each mapped to
// the node it was first reached from, for chain.
func (g *importGraph) reach(id string) map[string]string {
	parent := map[string]string{}
	queue := []string{id}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for _, m := range g.imports[n] {
			if _, ok := parent[m]; ok || m == id {
				continue
			}
			parent[m] = n
			queue = append(queue, m)
		}
	}
	return parent
}

// chain renders the shortest import chain ending at dep, e.g.
// "storage -> storage/internal/x -> proto".
func (g *importGraph) chain(parent map[string]string, dep string) string {
	var links []string
	for n := dep; n != ""; n = parent[n] {
		links = append(links, rel(stripVariant(n)))
	}
	for i, j := 0, len(links)-1; i < j; i, j = i+1, j-1 {
		links[i], links[j] = links[j], links[i]
	}
	return strings.Join(links, " -> ")
}

// stripVariant turns a go list ID into an import path: "p [q.test]" -> "p".
func stripVariant(id string) string {
	if i := strings.Index(id, " ["); i >= 0 {
		return id[:i]
	}
	return id
}

func testSuffix(id string) string {
	if strings.Contains(id, " [") {
		return " (with its tests)"
	}
	return ""
}

func inModule(path string) bool { return match(path, modulePath+"/...") }

// rel shortens import paths of the main module for messages.
func rel(path string) string {
	if s, ok := strings.CutPrefix(path, modulePath+"/"); ok {
		return s
	}
	return path
}

// match reports whether an import path matches a pattern ("x" or "x/...");
// patterns without a domain are relative to the main module.
func match(path, pattern string) bool {
	if pattern == "..." {
		return inModule(path)
	}
	if first, _, _ := strings.Cut(pattern, "/"); !strings.Contains(first, ".") {
		pattern = modulePath + "/" + pattern
	}
	if prefix, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == prefix || strings.HasPrefix(path, prefix+"/")
	}
	return path == pattern
}

// TestMatch pins down the pattern language of importRules.
func TestMatch(t *testing.T) {
	for _, c := range []struct {
		path, pattern string
		want          bool
	}{
		{modulePath + "/storage", "storage", true},
		{modulePath + "/storage/wal", "storage", false},
		{modulePath + "/storage/wal", "storage/...", true},
		{modulePath + "/storage", "storage/...", true},
		{modulePath + "/storagex", "storage/...", false},
		{modulePath + "/cmd/shalectl", "...", true},
		{"github.com/other/storage", "storage/...", false},
		{"fmt", "...", false},
		{"github.com/cockroachdb/pebble/v2/vfs", "github.com/cockroachdb/pebble/...", true},
		{"go.etcd.io/etcd/server/v3/etcdserver", "go.etcd.io/etcd/server/...", true},
		{"go.etcd.io/raft/v3", "go.etcd.io/etcd/server/...", false},
		{"go.etcd.io/etcd/client/v3", "go.etcd.io/etcd/server/...", false},
	} {
		if got := match(c.path, c.pattern); got != c.want {
			t.Errorf("match(%q, %q) = %v, want %v", c.path, c.pattern, got, c.want)
		}
	}
}

func matchAny(path string, patterns []string) bool {
	for _, p := range patterns {
		if match(path, p) {
			return true
		}
	}
	return false
}

// TestStorageDocComments requires a doc comment on every exported identifier
// in the production code under storage/: package-level functions, methods of
// exported types, types, constants and variables (a comment on a const/var
// block, or a trailing line comment, counts), methods of exported interfaces
// (their doc comment is the method's contract; an interface doc comment that
// names the method counts), and the fields of exported *Options structs (each
// states its default; an undocumented field is covered by the nearest field
// doc comment above it if that comment names it).
func TestStorageDocComments(t *testing.T) {
	var missing []string
	forEachSourceFile(t, "storage", func(fset *token.FileSet, path string, f *ast.File) {
		report := func(pos token.Pos, what, name string) {
			missing = append(missing, fmt.Sprintf("%s:%d: exported %s %s has no doc comment",
				path, fset.Position(pos).Line, what, name))
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() || d.Doc != nil {
					continue
				}
				if d.Recv == nil {
					report(d.Pos(), "func", d.Name.Name)
				} else if recv := receiverType(d); ast.IsExported(recv) {
					report(d.Pos(), "method", recv+"."+d.Name.Name)
				}
			case *ast.GenDecl:
				grouped := d.Lparen.IsValid()
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						doc := s.Doc
						if doc == nil && !grouped {
							doc = d.Doc
						}
						if doc == nil {
							report(s.Pos(), "type", s.Name.Name)
						}
						checkMembers(s, doc, report)
					case *ast.ValueSpec:
						if s.Doc != nil || s.Comment != nil || d.Doc != nil {
							continue
						}
						for _, n := range s.Names {
							if n.IsExported() {
								report(n.Pos(), strings.ToLower(d.Tok.String()), n.Name)
							}
						}
					}
				}
			}
		}
	})
	for _, m := range missing {
		t.Errorf("%s", m)
	}
}

// checkMembers reports undocumented methods of an exported interface and
// undocumented fields of an exported *Options struct. typeDoc is the doc
// comment of the type (nil if none).
func checkMembers(s *ast.TypeSpec, typeDoc *ast.CommentGroup, report func(token.Pos, string, string)) {
	switch typ := s.Type.(type) {
	case *ast.InterfaceType:
		for _, m := range typ.Methods.List {
			if _, isMethod := m.Type.(*ast.FuncType); !isMethod || m.Doc != nil || m.Comment != nil {
				continue
			}
			for _, n := range m.Names {
				if n.IsExported() && !mentions(typeDoc, n.Name) {
					report(n.Pos(), "interface method", s.Name.Name+"."+n.Name)
				}
			}
		}
	case *ast.StructType:
		if !strings.HasSuffix(s.Name.Name, "Options") {
			return
		}
		var lastDoc *ast.CommentGroup // covers the fields that follow it if it names them
		for _, fld := range typ.Fields.List {
			if fld.Doc != nil {
				lastDoc = fld.Doc
			}
			if fld.Doc != nil || fld.Comment != nil {
				continue
			}
			for _, n := range fld.Names {
				if n.IsExported() && !mentions(lastDoc, n.Name) {
					report(n.Pos(), "option field", s.Name.Name+"."+n.Name)
				}
			}
		}
	}
}

// mentions reports whether a doc comment names an identifier as a word.
func mentions(doc *ast.CommentGroup, name string) bool {
	if doc == nil {
		return false
	}
	isIdent := func(r rune) bool {
		return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r)
	}
	for _, word := range strings.FieldsFunc(doc.Text(), func(r rune) bool { return !isIdent(r) }) {
		if word == name {
			return true
		}
	}
	return false
}

// receiverType returns the name of a method's receiver base type.
func receiverType(d *ast.FuncDecl) string {
	typ := d.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
		case *ast.IndexExpr: // generic receiver T[P]
			typ = x.X
		case *ast.IndexListExpr: // generic receiver T[P, Q]
			typ = x.X
		case *ast.ParenExpr:
			typ = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// TestStoragePanicsAreInvariants allows panic in production code under
// storage/ only where a broken internal invariant (a bug, never bad input or
// an I/O error) is the cause, stated by a comment containing "invariant:" on
// the same line as the panic or on the line just above it. Errors that a
// caller or the disk can cause are returned, not panicked.
func TestStoragePanicsAreInvariants(t *testing.T) {
	var bad []string
	forEachSourceFile(t, "storage", func(fset *token.FileSet, path string, f *ast.File) {
		invariantLines := map[int]bool{}
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if strings.Contains(c.Text, "invariant:") {
					invariantLines[fset.Position(c.End()).Line] = true
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if id, ok := call.Fun.(*ast.Ident); !ok || id.Name != "panic" {
				return true
			}
			line := fset.Position(call.Pos()).Line
			if !invariantLines[line] && !invariantLines[line-1] {
				bad = append(bad, fmt.Sprintf("%s:%d: panic without an `// invariant:` comment "+
					"(return an error instead, or state the invariant the panic guards)", path, line))
			}
			return true
		})
	})
	for _, b := range bad {
		t.Errorf("%s", b)
	}
}

// TestGofmt requires every Go file in the repository (generated *.pb.go
// files and testdata excepted) to be formatted as gofmt would.
func TestGofmt(t *testing.T) {
	root := repoRoot(t)
	var bad []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			if top := filepath.Dir(path) == root; top && (d.Name() == "bin" || d.Name() == "data") {
				return filepath.SkipDir // build output and benchmark data (make build, run, bench)
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		relPath, _ := filepath.Rel(root, path)
		formatted, err := format.Source(src)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: does not parse: %v", relPath, err))
		} else if !bytes.Equal(src, formatted) {
			bad = append(bad, fmt.Sprintf("%s: not gofmt-formatted (run gofmt -w %s)", relPath, relPath))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Errorf("%s", b)
	}
}

// forEachSourceFile parses every production (non-test, non-generated,
// non-main) Go file under dir, relative to the repository root, and calls fn
// with its path relative to the root. Parse errors fail the test.
func forEachSourceFile(t *testing.T, dir string, fn func(*token.FileSet, string, *ast.File)) {
	t.Helper()
	root := repoRoot(t)
	start := filepath.Join(root, dir)
	if _, err := os.Stat(start); errors.Is(err, fs.ErrNotExist) {
		t.Logf("%s/ does not exist yet; nothing to check", dir)
		return
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(start, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != start && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		relPath, _ := filepath.Rel(root, path)
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Errorf("%s: %v", relPath, err)
			return nil
		}
		if ast.IsGenerated(f) || f.Name.Name == "main" {
			return nil
		}
		fn(fset, relPath, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// skipDir reports whether the go tool ignores a directory of this name (and
// so should the source checks).
func skipDir(name string) bool {
	return name == "testdata" || name == "vendor" ||
		strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

// repoRoot walks up from the working directory to the directory holding the
// main module's go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(data), "module "+modulePath+"\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod of module %s above the working directory", modulePath)
		}
		dir = parent
	}
}

// goCmd runs the go tool in the repository root and returns its stdout.
func goCmd(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = repoRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}
