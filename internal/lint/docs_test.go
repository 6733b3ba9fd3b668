package lint

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// markdownFiles returns the repository's Markdown files (relative paths),
// leaving out hidden, build and data folders.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "data" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fence        = regexp.MustCompile("^\\s*```")
	inlineSpan   = regexp.MustCompile("`[^`]*`")
)

// headingAnchors returns the anchors GitHub gives a Markdown text's
// headings: lower case, punctuation but '-' and '_' dropped, spaces as
// '-', and -1, -2... on repeats.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(text, "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		anchor := b.String()
		if n := seen[anchor]; n > 0 {
			anchors[anchor+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[anchor] = true
		}
		seen[anchor]++
	}
	return anchors
}

// TestDocLinksResolve checks every relative link in the repository's
// Markdown: the file or folder it names exists, and an #anchor into a
// Markdown file names one of its headings.
func TestDocLinksResolve(t *testing.T) {
	root := repoRoot(t)
	files := markdownFiles(t, root)
	if len(files) < 10 {
		t.Fatalf("found only %d Markdown files under %s", len(files), root)
	}
	anchorsOf := map[string]map[string]bool{}
	anchors := func(path string) (map[string]bool, error) {
		if a, ok := anchorsOf[path]; ok {
			return a, nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		anchorsOf[path] = headingAnchors(string(text))
		return anchorsOf[path], nil
	}
	links := 0
	for _, rel := range files {
		text, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		inFence := false
		for i, line := range strings.Split(string(text), "\n") {
			if fence.MatchString(line) {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			for _, m := range markdownLink.FindAllStringSubmatch(inlineSpan.ReplaceAllString(line, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				path, anchor, _ := strings.Cut(target, "#")
				full := filepath.Join(root, rel)
				if path != "" {
					full = filepath.Join(root, filepath.Dir(rel), path)
					if _, err := os.Stat(full); err != nil {
						t.Errorf("%s:%d: link to %s: no such file or folder", rel, i+1, target)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(full, ".md") {
					continue
				}
				a, err := anchors(full)
				if err != nil {
					t.Fatal(err)
				}
				if !a[anchor] {
					t.Errorf("%s:%d: link to %s: %s has no heading with anchor #%s", rel, i+1, target, path, anchor)
				}
			}
		}
	}
	if links < 50 {
		t.Fatalf("found only %d relative links; the parser is broken", links)
	}
}

// TestReadmeLayoutNamesEveryFolder checks that README's layout table has a
// row for every top-level folder of the repository.
func TestReadmeLayoutNamesEveryFolder(t *testing.T) {
	root := repoRoot(t)
	text, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(text), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no \"## Layout\" section")
	}
	layout, _, _ = strings.Cut(layout, "\n## ")
	named := map[string]bool{}
	for _, line := range strings.Split(layout, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		firstCell, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, code := range inlineSpan.FindAllString(firstCell, -1) {
			name := strings.Trim(code, "`")
			top, _, _ := strings.Cut(name, "/")
			named[top] = true
		}
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	ignored := map[string]bool{"bin": true, "data": true, "tmp": true, "fuzzcache": true}
	folders := 0
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || ignored[e.Name()] {
			continue
		}
		folders++
		if !named[e.Name()] {
			t.Errorf("README.md's layout table has no row for the folder %s/", e.Name())
		}
	}
	if folders < 5 {
		t.Fatalf("found only %d top-level folders in %s", folders, root)
	}
}

// TestDocCodeFencesBalanced checks that every code fence in the
// repository's Markdown is a line of its own (``` or ```lang), and that
// every opened block is closed: a closing fence with text after it (as
// README once had) leaves the rest of the file inside a code block.
func TestDocCodeFencesBalanced(t *testing.T) {
	root := repoRoot(t)
	fenceLine := regexp.MustCompile("^\\s*```[A-Za-z0-9_+-]*\\s*$")
	for _, rel := range markdownFiles(t, root) {
		text, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		open := 0
		for i, line := range strings.Split(string(text), "\n") {
			if !fence.MatchString(line) {
				continue
			}
			if !fenceLine.MatchString(line) || (open != 0 && strings.TrimSpace(line) != "```") {
				t.Errorf("%s:%d: a code fence must be a line of its own (``` or ```lang; a closing one just ```): %q", rel, i+1, line)
			}
			if open == 0 {
				open = i + 1
			} else {
				open = 0
			}
		}
		if open != 0 {
			t.Errorf("%s:%d: code block never closed", rel, open)
		}
	}
}
