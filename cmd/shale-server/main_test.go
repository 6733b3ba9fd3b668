package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// helpFlags runs `shale-server --help` in process and returns the flag
// names its "Flags:" section lists.
func helpFlags(t *testing.T) []string {
	t.Helper()
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("--help: %v", err)
	}
	help := out.String()
	_, section, ok := strings.Cut(help, "\nFlags:\n")
	if !ok {
		t.Fatalf("--help output has no Flags section:\n%s", help)
	}
	re := regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)`)
	var names []string
	for _, line := range strings.Split(section, "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			names = append(names, m[1])
		}
	}
	if len(names) == 0 {
		t.Fatalf("no flags found in --help output:\n%s", help)
	}
	return names
}

// TestHelpFlagsDocumented checks that every flag `shale-server --help`
// prints is documented in docs/shale-server.md: its --name, its SHALE_*
// environment variable and, in the same table row, its default.
func TestHelpFlagsDocumented(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "shale-server.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	names := helpFlags(t)

	// The help output and the flag set agree (nothing hidden or missing).
	cmd := newRootCmd()
	cmd.InitDefaultHelpFlag()
	listed := map[string]bool{}
	for _, n := range names {
		listed[n] = true
	}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !listed[f.Name] && !f.Hidden {
			t.Errorf("flag --%s is missing from --help", f.Name)
		}
	})

	// Flag table rows: the first cell is the flag.
	rows := map[string]string{}
	first := regexp.MustCompile("^`--([a-z0-9-]+)`$")
	for _, line := range strings.Split(doc, "\n") {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) < 3 || cells[0] != "" {
			continue
		}
		if m := first.FindStringSubmatch(strings.TrimSpace(cells[1])); m != nil {
			if _, dup := rows[m[1]]; dup {
				t.Errorf("docs/shale-server.md: two rows for --%s", m[1])
			}
			rows[m[1]] = line
		}
	}
	for _, name := range names {
		if !strings.Contains(doc, "`--"+name+"`") {
			t.Errorf("docs/shale-server.md does not document --%s", name)
			continue
		}
		if name == "help" {
			continue
		}
		row, ok := rows[name]
		if !ok {
			t.Errorf("docs/shale-server.md: --%s has no row in a flag table", name)
			continue
		}
		env := "SHALE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		if !strings.Contains(row, "`"+env+"`") {
			t.Errorf("docs/shale-server.md: the row of --%s does not name %s", name, env)
		}
		f := cmd.Flags().Lookup(name)
		if f == nil {
			t.Errorf("--%s is in --help but not in the flag set", name)
			continue
		}
		if def := f.DefValue; def != "" && !strings.Contains(row, "`"+def+"`") {
			t.Errorf("docs/shale-server.md: the row of --%s does not give its default `%s`:\n%s", name, def, row)
		}
	}
	// And nothing documented that does not exist.
	for name := range rows {
		if cmd.Flags().Lookup(name) == nil {
			t.Errorf("docs/shale-server.md documents --%s, which shale-server does not have", name)
		}
	}
}

// TestHelpEnvBinding checks the SHALE_* environment fallback the docs
// describe: the environment sets a flag not given, the command line wins.
func TestHelpEnvBinding(t *testing.T) {
	t.Setenv("SHALE_ZONE", "zone-from-env")
	t.Setenv("SHALE_MAX_KEY_BYTES", "99")
	cmd := newRootCmd()
	if err := cmd.Flags().Parse([]string{"--max-key-bytes", "7"}); err != nil {
		t.Fatal(err)
	}
	if err := bindEnv(cmd.Flags()); err != nil {
		t.Fatal(err)
	}
	if got := cmd.Flags().Lookup("zone").Value.String(); got != "zone-from-env" {
		t.Errorf("--zone = %q, want it from SHALE_ZONE", got)
	}
	if got := cmd.Flags().Lookup("max-key-bytes").Value.String(); got != "7" {
		t.Errorf("--max-key-bytes = %q, want the command line's 7 over SHALE_MAX_KEY_BYTES", got)
	}
	t.Setenv("SHALE_ELECTION_TICKS", "many")
	if err := bindEnv(newRootCmd().Flags()); err == nil || !strings.Contains(err.Error(), "SHALE_ELECTION_TICKS") {
		t.Errorf("a malformed SHALE_ELECTION_TICKS: err = %v, want one naming it", err)
	}
}
