package grafana

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/server"
)

// dashboard is the part of Grafana's dashboard model (schemaVersion 39)
// that the checks read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Time struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"time"`
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	GridPos    *gridPos       `json:"gridPos"`
	Targets    []target       `json:"targets"`
	// Panels are those of a collapsed row.
	Panels []panel `json:"panels"`
}

type gridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	RefID      string         `json:"refId"`
	Expr       string         `json:"expr"`
	Datasource *datasourceRef `json:"datasource"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *datasourceRef  `json:"datasource"`
}

// queryText is a query variable's query: a string, or (Grafana 10+) an
// object whose "query" field is the string.
func (v variable) queryText() (string, error) {
	var s string
	if err := json.Unmarshal(v.Query, &s); err == nil {
		return s, nil
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &o); err != nil {
		return "", fmt.Errorf("variable %s: query is neither a string nor {query: string}: %v", v.Name, err)
	}
	return o.Query, nil
}

const dashboardFile = "shale.json"

func loadDashboard(t *testing.T) *dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return &d
}

// allPanels are the dashboard's panels, those of collapsed rows included.
func (d *dashboard) allPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// exprs are the PromQL expressions of the dashboard, each with where it is.
func (d *dashboard) exprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			out[fmt.Sprintf("panel %d %q target %s", p.ID, p.Title, tg.RefID)] = tg.Expr
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, err := v.queryText()
		if err != nil {
			t.Fatal(err)
		}
		// Grafana's label_values(SELECTOR, LABEL) and label_values(LABEL):
		// only the selector is PromQL.
		if m := regexp.MustCompile(`^\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`).FindStringSubmatch(q); m != nil {
			q = m[1]
		} else if regexp.MustCompile(`^\s*label_values\(\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`).MatchString(q) {
			continue
		}
		out["variable "+v.Name] = q
	}
	return out
}

// TestDashboardModel checks the shape of shale.json as a Grafana dashboard.
func TestDashboardModel(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both must be set", d.UID, d.Title)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want a current model (36 or later)", d.SchemaVersion)
	}
	if d.Time.From == "" || d.Time.To == "" {
		t.Error("time range not set")
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		if _, dup := vars[v.Name]; dup {
			t.Errorf("variable %s defined twice", v.Name)
		}
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || !strings.Contains(string(v.Query), "prometheus") {
		t.Errorf("want a Prometheus datasource variable named datasource, have %+v", v)
	}
	for _, name := range []string{"node", "shard"} {
		v, ok := vars[name]
		if !ok || v.Type != "query" {
			t.Errorf("want a query variable %s", name)
			continue
		}
		if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
			t.Errorf("variable %s: datasource %+v, want uid ${datasource}", name, v.Datasource)
		}
	}
	ids := map[int]string{}
	var boxes []panel
	for _, p := range d.allPanels() {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.ID <= 0 {
			t.Errorf("%s: no id", where)
		} else if other, dup := ids[p.ID]; dup {
			t.Errorf("%s: id also used by %q", where, other)
		}
		ids[p.ID] = p.Title
		if p.Title == "" {
			t.Errorf("%s: no title", where)
		}
		if p.Type == "" {
			t.Errorf("%s: no type", where)
		}
		if g := p.GridPos; g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v: want w, h > 0 inside the 24 columns", where, g)
		} else {
			for _, q := range boxes {
				o := q.GridPos
				if g.X < o.X+o.W && o.X < g.X+g.W && g.Y < o.Y+o.H && o.Y < g.Y+g.H {
					t.Errorf("%s overlaps panel %d %q", where, q.ID, q.Title)
				}
			}
			boxes = append(boxes, p)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", where)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: datasource %+v, want uid ${datasource}", where, p.Datasource)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s: target refId %q missing or repeated", where, tg.RefID)
			}
			refs[tg.RefID] = true
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s target %s: no expr", where, tg.RefID)
			}
		}
	}
	// Every variable an expression uses is defined (or one of Grafana's).
	varRef := regexp.MustCompile(`\$(?:\{([a-zA-Z_][a-zA-Z0-9_]*)(?::[a-z]+)?\}|([a-zA-Z_][a-zA-Z0-9_]*))`)
	for where, e := range d.exprs(t) {
		for _, m := range varRef.FindAllStringSubmatch(e, -1) {
			name := m[1] + m[2]
			if _, ok := vars[name]; !ok && !strings.HasPrefix(name, "__") {
				t.Errorf("%s: uses undefined variable $%s", where, name)
			}
		}
		if _, err := metricNames(e); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}
}

// promKeywords are PromQL's aggregation operators and keywords: bare
// identifiers that are not metric names.
var promKeywords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
	"and": true, "or": true, "unless": true, "atan2": true, "offset": true, "bool": true,
	"inf": true, "nan": true,
}

// labelListKeywords are followed by a parenthesized list of label names.
var labelListKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func isIdentChar(c byte) bool { return isIdentStart(c) || '0' <= c && c <= '9' }

// skipQuoted returns the index after the string literal starting at i.
func skipQuoted(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at %d", i)
}

// skipGroup returns the index after the group that opens at s[i] (one of
// ( [ {), skipping string literals inside it.
func skipGroup(s string, i int) (int, error) {
	closer := map[byte]byte{'(': ')', '[': ']', '{': '}'}
	var stack []byte
	for j := i; j < len(s); j++ {
		switch c := s[j]; c {
		case '"', '\'', '`':
			k, err := skipQuoted(s, j)
			if err != nil {
				return 0, err
			}
			j = k - 1
		case '(', '[', '{':
			stack = append(stack, closer[c])
		case ')', ']', '}':
			if len(stack) == 0 || stack[len(stack)-1] != c {
				return 0, fmt.Errorf("unbalanced %q at %d", c, j)
			}
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("unclosed %q at %d", s[i], i)
}

// metricNames returns the metric names a PromQL expression (with Grafana
// variables) selects: the bare identifiers that are not functions (those
// are followed by "("), aggregation operators or keywords, nor label names
// (inside {} matchers, or the lists of by, without, on, ignoring,
// group_left and group_right); string literals, ranges ([5m],
// [$__rate_interval]), numbers and Grafana variables are skipped. Names
// are returned as written (histogram series suffixes included).
func metricNames(expr string) ([]string, error) {
	var names []string
	s := expr
	depth := 0 // of parentheses
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#': // a comment, to the end of the line
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j, err := skipQuoted(s, i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{' || c == '[':
			// Label matchers (of a selector, or a selector with no name)
			// and ranges, offsets and subqueries hold no metric names.
			j, err := skipGroup(s, i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '$':
			// A Grafana variable: $name, ${name} or ${name:format}.
			i++
			if i < len(s) && s[i] == '{' {
				j := strings.IndexByte(s[i:], '}')
				if j < 0 {
					return nil, fmt.Errorf("unclosed ${ at %d", i)
				}
				i += j + 1
				continue
			}
			for i < len(s) && isIdentChar(s[i]) {
				i++
			}
		case '0' <= c && c <= '9' || c == '.' && i+1 < len(s) && '0' <= s[i+1] && s[i+1] <= '9':
			// A number or a duration: 0.99, 1e-3, 0x1f, 5m, 1h30m.
			for i < len(s) && (isIdentChar(s[i]) || s[i] == '.' ||
				(s[i] == '-' || s[i] == '+') && (s[i-1] == 'e' || s[i-1] == 'E')) {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdentChar(s[j]) {
				j++
			}
			word := s[i:j]
			k := j
			for k < len(s) && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r') {
				k++
			}
			lower := strings.ToLower(word)
			switch {
			case labelListKeywords[lower]:
				if k < len(s) && s[k] == '(' {
					end, err := skipGroup(s, k)
					if err != nil {
						return nil, err
					}
					j = end
				}
			case promKeywords[lower]:
			case k < len(s) && s[k] == '(':
				// A function call: its arguments are read on.
			default:
				names = append(names, word)
			}
			i = j
		case c == '(':
			depth++
			i++
		case c == ')':
			if depth--; depth < 0 {
				return nil, fmt.Errorf("unbalanced ')' at %d", i)
			}
			i++
		default:
			// Operators, commas, @.
			i++
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("%d unclosed '('", depth)
	}
	return names, nil
}

func TestDashboardMetricNameTokenizer(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want string
	}{
		{`up`, `up`},
		{`rate(a_total{job="x", le=~"1|2"}[5m])`, `a_total`},
		{`histogram_quantile(0.99, sum by (le, grpc_method) (rate(h_bucket{instance=~"$node"}[$__rate_interval])))`, `h_bucket`},
		{`sum(rate(x[1m])) by (instance) / on (instance) group_left (zone) y`, `x y`},
		{`count(max by (shard) (g) == 0) or vector(0)`, `g`},
		{`time() - max by (kind) (ts{engine=~"raftlog|shard-($shard)"})`, `ts`},
		{`a and on (instance) b == 1 unless ignoring(x) c offset 5m`, `a b c`},
		{`{__name__="hidden"} + 1e-3 * d`, `d`},
		{`max_over_time(e[1h:5m]) > bool 0.5`, `e`},
		{`f{a="}{ \" ("} + ${datasource} + g`, `f g`},
	} {
		got, err := metricNames(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s: names %q, want %q", tc.expr, got, tc.want)
		}
	}
	for _, bad := range []string{`rate(x[5m]`, `x{a="b}`, `sum(x))`, `sum by (a (x)`} {
		if _, err := metricNames(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// families parses a Prometheus text exposition into metric family types
// (# TYPE lines; an untyped sample line counts as "untyped").
func families(text string, into map[string]string) {
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			into[f[2]] = f[3]
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		if _, ok := into[name]; !ok {
			into[name] = "untyped"
		}
	}
}

// missingMetrics returns why each name is not a series of the families.
func missingMetrics(names map[string][]string, fams map[string]string) []string {
	var missing []string
	for name, where := range names {
		typ, ok := fams[name]
		switch {
		case ok && (typ == "histogram" || typ == "summary"):
			missing = append(missing, fmt.Sprintf("%s is a %s: query its _bucket, _sum or _count series (%s)", name, typ, strings.Join(where, "; ")))
		case ok:
		default:
			found := false
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				base, cut := strings.CutSuffix(name, suffix)
				if !cut {
					continue
				}
				if bt := fams[base]; bt == "histogram" || bt == "summary" && suffix != "_bucket" {
					found = true
				}
			}
			if !found {
				missing = append(missing, fmt.Sprintf("%s (%s)", name, strings.Join(where, "; ")))
			}
		}
	}
	sort.Strings(missing)
	return missing
}

// TestDashboardMetricsExist starts a 3-node cluster, sends it a little of
// every kind of traffic the dashboard shows (puts, gets, a watch, a split,
// a backup of a shard), and checks that every metric the dashboard queries
// is in some node's /metrics. Vector metrics (by kind, node, method) appear
// only once something set them, and the placement leader's per-node
// metrics only once it has run a round, so the scrape is retried until
// every name is there or 30 seconds pass.
func TestDashboardMetricsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	d := loadDashboard(t)
	names := map[string][]string{}
	for where, e := range d.exprs(t) {
		ns, err := metricNames(e)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		for _, n := range ns {
			names[n] = append(names[n], where)
		}
	}
	if len(names) == 0 {
		t.Fatal("the dashboard queries no metrics")
	}

	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) { cfg.HTTPAddr = "127.0.0.1:0" }})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := client.New(ctx, c.Endpoints(), client.WithDefaultTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var first uint64
	for i, k := range []string{"dash/a", "dash/b", "dash/a", "zz"} {
		r, err := cl.Put(ctx, []byte(k), []byte(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = r.Revision
		}
	}
	// From the first put's revision (one shard yet): a watch with no start
	// revision may start after the puts (chaos/README bug 31).
	watch := cl.Watch(wctx, nil, nil, client.WithWatchPrefix([]byte("dash/")), client.WithStartRevision(first))
	if _, err := cl.Get(ctx, []byte("dash/a")); err != nil {
		t.Fatal(err)
	}
	select {
	case r, ok := <-watch:
		if !ok || r.Err != nil {
			t.Fatalf("watch: %+v", r)
		}
	case <-ctx.Done():
		t.Fatal("no watch event")
	}
	if _, _, err := cl.SplitShard(ctx, []byte("m")); err != nil {
		t.Fatal(err)
	}
	c.WaitLeaders(30 * time.Second)
	// A backup of a shard's replica on its leader, read to its end.
	shard := c.ShardIDs()[len(c.ShardIDs())-1]
	stream, err := cl.BackupShard(ctx, c.Leader(shard), shard, nil)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("backup of shard %d: %v", shard, err)
		}
	}

	scrape := func() map[string]string {
		fams := map[string]string{}
		for _, id := range c.NodeIDs() {
			resp, err := http.Get("http://" + c.Node(id).HTTPAddr() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("node %d /metrics: %s %v", id, resp.Status, err)
			}
			families(string(b), fams)
		}
		return fams
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		missing := missingMetrics(names, scrape())
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dashboard queries metrics that no node exports:\n%s", strings.Join(missing, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("%d metric names of the dashboard found in /metrics", len(names))
}

// TestDashboardMetricMatching checks how query names are matched with the
// families of a scrape: histogram series by their suffixes, never the bare
// histogram name.
func TestDashboardMetricMatching(t *testing.T) {
	fams := map[string]string{}
	families("# HELP h_seconds x\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"1\"} 1\nh_seconds_sum 1\nh_seconds_count 1\n"+
		"# TYPE c_total counter\nc_total 3\nuntyped_thing{a=\"b\"} 1\n# TYPE c_count counter\nc_count 1\n", fams)
	got := missingMetrics(map[string][]string{
		"h_seconds_bucket": {"p"}, "h_seconds_sum": {"p"}, "h_seconds_count": {"p"}, "c_total": {"p"},
		"untyped_thing": {"p"}, "c_count": {"p"},
		"h_seconds": {"bare"}, "c_total_sum": {"made-up suffix"}, "c_bucket": {"no family c"}, "nope_total": {"made up"},
	}, fams)
	want := []string{
		"c_bucket (no family c)",
		"c_total_sum (made-up suffix)",
		"h_seconds is a histogram: query its _bucket, _sum or _count series (bare)",
		"nope_total (made up)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("missing:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
