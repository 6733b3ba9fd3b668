package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestDocsShowOnlyRealCommands checks every shalectl command line shown in
// the repository's Markdown (fenced code blocks, and inline code that
// starts with shalectl) against the command tree: each subcommand named
// exists, each flag exists on the command it is given to, and `--help` of
// that command succeeds. Synopsis lines are understood: `a | b` lists
// alternatives of one group, `get|put` alternative subcommands, `[...]`
// optional parts, and upper-case words, `<...>` and `...` placeholders.
func TestDocsShowOnlyRealCommands(t *testing.T) {
	root := filepath.Join("..", "..")
	var checked int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "data" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".md") {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, line := range shalectlLines(string(text)) {
			checked++
			problems, _ := checkDocLine(line.text)
			for _, problem := range problems {
				t.Errorf("%s:%d: %s\n\t%s", rel, line.num, problem, line.text)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("found only %d shalectl command lines in the docs; the parser is broken", checked)
	}
}

// docLine is one shalectl command line found in a Markdown file.
type docLine struct {
	num  int
	text string // from the word shalectl on
}

var (
	shalectlWord = regexp.MustCompile(`(^|[\s/` + "`" + `])shalectl(\s|$)`)
	inlineCode   = regexp.MustCompile("`([^`]+)`")
)

// shalectlLines returns the shalectl command lines of a Markdown text: in
// fenced code blocks, every line naming the command (with its `|`
// indented continuation lines, starting with | or [, joined on), and outside them, inline code spans that
// start with it.
func shalectlLines(text string) []docLine {
	var out []docLine
	lines := strings.Split(text, "\n")
	inFence := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			loc := shalectlWord.FindStringIndex(line)
			if loc == nil || strings.HasSuffix(line[:loc[0]+1], "cmd/") {
				continue // not a command line, or the source folder cmd/shalectl
			}
			if i+1 < len(lines) && strings.HasPrefix(lines[i+1], "shalectl: unknown command") {
				continue // an example of a mistake, shown with its error
			}
			cmd := strings.TrimLeft(line[loc[0]:], " /`")
			num := i + 1
			for i+1 < len(lines) && strings.HasPrefix(lines[i+1], " ") &&
				(strings.HasPrefix(strings.TrimSpace(lines[i+1]), "| ") || strings.HasPrefix(strings.TrimSpace(lines[i+1]), "[")) {
				i++
				cmd += " " + strings.TrimSpace(lines[i])
			}
			for strings.HasSuffix(cmd, `\`) && i+1 < len(lines) {
				i++
				cmd = strings.TrimSuffix(cmd, `\`) + " " + strings.TrimSpace(lines[i])
			}
			out = append(out, docLine{num: num, text: cmd})
			continue
		}
		for _, m := range inlineCode.FindAllStringSubmatch(line, -1) {
			code := strings.TrimSpace(m[1])
			for _, prefix := range []string{"bin/shalectl ", "shalectl "} {
				if strings.HasPrefix(code, prefix) {
					out = append(out, docLine{num: i + 1, text: strings.TrimPrefix(code, "bin/")})
				}
			}
		}
	}
	return out
}

// checkDocLine returns what is wrong with one documented command line.
func checkDocLine(line string) (problems []string, reached []*cobra.Command) {
	// The command ends where the shell line does.
	for _, stop := range []string{" #", " &&", " ||", ";", " >", " <<", " 2>", " $("} {
		if i := strings.Index(line, stop); i >= 0 {
			line = line[:i]
		}
	}
	root := newRootCmd()
	root.InitDefaultCompletionCmd() // cobra adds it when it executes
	group, lastCmd := root, root
	for si, seg := range strings.Split(line, " | ") {
		words := strings.Fields(seg)
		if si == 0 {
			words = words[1:] // shalectl
		}
		cmd := group
		// A segment that starts with a flag gives flags of the command the
		// previous alternative reached ([--pin D | --no-pin]).
		if si > 0 && len(words) > 0 && strings.HasPrefix(strings.TrimLeft(words[0], "["), "-") {
			cmd = lastCmd // flags of the previous alternative
		}
		for wi := 0; wi < len(words); wi++ {
			optional := strings.HasPrefix(words[wi], "[")
			w := strings.Trim(words[wi], "[]()`\"',")
			switch {
			case strings.HasPrefix(w, "<") && cmd.HasSubCommands():
				reached = append(reached, cmd.Commands()...) // <command>: any of them
				continue
			case w == "" || w == "..." || strings.HasPrefix(w, "<") || strings.HasPrefix(w, "$"):
				continue
			case strings.HasPrefix(w, "-") && len(w) > 1:
				name, _, hasValue := strings.Cut(w, "=")
				f := lookupFlag(cmd, name)
				if f == nil {
					problems = append(problems, fmt.Sprintf("%s has no flag %s", cmd.CommandPath(), name))
					continue
				}
				if !hasValue && f.Value.Type() != "bool" && wi+1 < len(words) && !strings.HasPrefix(words[wi+1], "-") {
					wi++ // its value
				}
			case cmd.HasSubCommands():
				if isPlaceholder(w) || optional {
					continue
				}
				alts := strings.Split(w, "|")
				var next *cobra.Command
				for _, alt := range alts {
					sub := subcommand(cmd, alt)
					if sub == nil {
						problems = append(problems, fmt.Sprintf("%s has no subcommand %q", cmd.CommandPath(), alt))
						continue
					}
					reached = append(reached, sub)
					if next == nil {
						next = sub
					}
				}
				if next == nil {
					return problems, reached
				}
				if si == 0 || cmd != group {
					group = cmd
				}
				cmd = next
			}
		}
		lastCmd = cmd
		if len(problems) == 0 {
			if err := helpOf(cmd); err != nil {
				problems = append(problems, fmt.Sprintf("%s --help: %v", cmd.CommandPath(), err))
			}
		}
	}
	return problems, reached
}

// isPlaceholder reports whether a word of a synopsis stands for a value
// (KEY, NAME[:PASSWORD], A,B,...) rather than a subcommand.
func isPlaceholder(w string) bool {
	if strings.Contains(w, "...") {
		return true
	}
	letters := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return -1
	}, w)
	return letters != "" && strings.ToUpper(letters) == letters
}

// subcommand returns cmd's subcommand called name (or by an alias), or nil.
func subcommand(cmd *cobra.Command, name string) *cobra.Command {
	for _, c := range cmd.Commands() {
		if c.Name() == name || c.HasAlias(name) {
			return c
		}
	}
	return nil
}

// lookupFlag finds a flag (--name or -n) that cmd accepts, its own or
// inherited.
func lookupFlag(cmd *cobra.Command, flag string) *pflag.Flag {
	sets := []*pflag.FlagSet{cmd.Flags(), cmd.PersistentFlags(), cmd.InheritedFlags()}
	for _, s := range sets {
		if name, ok := strings.CutPrefix(flag, "--"); ok {
			if f := s.Lookup(name); f != nil {
				return f
			}
		} else if len(flag) == 2 {
			if f := s.ShorthandLookup(flag[1:]); f != nil {
				return f
			}
		}
	}
	return nil
}

// helpOf runs `shalectl <cmd path> --help` in-process.
func helpOf(cmd *cobra.Command) error {
	args := append(strings.Fields(cmd.CommandPath())[1:], "--help")
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		return fmt.Errorf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "Usage:") {
		return fmt.Errorf("no usage printed: %q", stdout.String())
	}
	return nil
}

// TestDocsShowEveryCommand checks the other direction for docs/shalectl.md:
// its synopsis (the first code block) reaches every command, each command
// has a section, and every flag of every command is mentioned.
func TestDocsShowEveryCommand(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("..", "..", "docs", "shalectl.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(text)
	start := strings.Index(doc, "```\n")
	end := strings.Index(doc[start+4:], "```")
	if start < 0 || end < 0 {
		t.Fatal("docs/shalectl.md has no synopsis code block")
	}
	inSynopsis := map[string]bool{}
	for _, line := range shalectlLines(doc[start : start+4+end+3]) {
		_, reached := checkDocLine(line.text)
		for _, c := range reached {
			inSynopsis[c.CommandPath()] = true
		}
	}
	headings := map[string]bool{}
	for _, line := range strings.Split(doc, "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			headings[strings.TrimSpace(strings.TrimLeft(h, "#"))] = true
		}
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			path := sub.CommandPath()
			if !inSynopsis[path] {
				t.Errorf("docs/shalectl.md's synopsis does not show %q", path)
			}
			// A section is headed by the command's path, or by its name
			// under its group's section (### get under ## debug ldb).
			if !sub.HasSubCommands() && !headings[strings.TrimPrefix(path, "shalectl ")] &&
				!(headings[sub.Name()] && headings[strings.TrimPrefix(sub.Parent().CommandPath(), "shalectl ")]) {
				t.Errorf("docs/shalectl.md has no section for %q", path)
			}
			sub.LocalFlags().VisitAll(func(f *pflag.Flag) {
				if f.Hidden || f.Name == "help" {
					return
				}
				if !strings.Contains(doc, "--"+f.Name) {
					t.Errorf("docs/shalectl.md never mentions %s's flag --%s", path, f.Name)
				}
			})
			walk(sub)
		}
	}
	walk(newRootCmd())
}
