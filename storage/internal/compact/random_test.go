package compact

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/manifest"
)

// refOverlap is an independent reference for "the two files share a user
// key", written directly from the sentinel rule rather than with span.
func refOverlap(a, b *manifest.FileMetadata) bool {
	return refRangeOverlap(a.Smallest, a.Largest, b.Smallest, b.Largest)
}

// refRangeOverlap reports whether the user-key ranges of the internal-key
// intervals [s1,l1] and [s2,l2] intersect, where a Largest that is a
// sentinel excludes its user key (unless it is also the Smallest's user key).
func refRangeOverlap(s1, l1, s2, l2 base.InternalKey) bool {
	// a ends before b starts?
	endsBefore := func(s, l, other base.InternalKey) bool {
		c := bytes.Compare(l.UserKey, other.UserKey)
		if c < 0 {
			return true
		}
		return c == 0 && l.IsExclusiveSentinel() && bytes.Compare(s.UserKey, l.UserKey) < 0
	}
	return !endsBefore(s1, l1, s2) && !endsBefore(s2, l2, s1)
}

func randomOptions(rng *rand.Rand) Options {
	opts := Options{
		L0CompactionTrigger:      2 + rng.IntN(3),
		LBaseMaxBytes:            uint64(2+rng.IntN(16)) << 20,
		LevelMultiplier:          float64(3 + rng.IntN(8)),
		DynamicLevelBytes:        rng.IntN(4) != 0,
		MaxConcurrentCompactions: 1 + rng.IntN(4),
	}
	opts.TargetFileSize[0] = uint64(256+rng.IntN(2048)) << 10
	if rng.IntN(2) == 0 {
		opts.MaxCompactionBytes = uint64(1+rng.IntN(64)) << 20
	}
	opts.EnsureDefaults()
	return opts
}

func userKey(i int) []byte { return []byte(fmt.Sprintf("k%04d", i)) }

// randomView builds a valid LevelsView: L1+ sorted and non-overlapping in
// internal-key order with some boundary user keys shared between neighbours
// (as real keys or behind a range-deletion sentinel); L0 overlapping, newest
// first; sequence numbers layered so that upper levels are newer.
func randomView(rng *rand.Rand) *LevelsView {
	v := &LevelsView{}
	num := manifest.FileNum(1)
	const keySpace = 1000
	for l := 1; l < manifest.NumLevels; l++ {
		if rng.IntN(3) == 0 {
			continue
		}
		band := base.SeqNum((manifest.NumLevels - l) * 10000)
		n := 1 + rng.IntN(12)
		cur := rng.IntN(50)
		for i := 0; i < n && cur < keySpace-2; i++ {
			start := cur
			end := start + 1 + rng.IntN(60)
			if end >= keySpace {
				end = keySpace - 1
			}
			f := &manifest.FileMetadata{
				FileNum:  num,
				Size:     uint64(1+rng.IntN(8<<10)) << 10,
				Smallest: base.MakeInternalKey(userKey(start), band+base.SeqNum(rng.IntN(5000)), base.KindSet),
			}
			num++
			switch r := rng.IntN(4); {
			case r == 0: // next file starts at the same user key (shared real key)
				f.Largest = base.MakeInternalKey(userKey(end), band+5000+base.SeqNum(rng.IntN(5000)), base.KindSet)
				cur = end
			case r == 1: // range tombstone ends exclusively where the next file starts
				f.Largest = base.MakeRangeDeleteSentinel(userKey(end))
				cur = end
			default:
				f.Largest = base.MakeInternalKey(userKey(end), band+5000+base.SeqNum(rng.IntN(5000)), base.KindSet)
				cur = end + 1 + rng.IntN(40)
			}
			f.SmallestSeq, f.LargestSeq = band, band+9999
			v.Levels[l] = append(v.Levels[l], f)
		}
	}
	nL0 := rng.IntN(10)
	for i := 0; i < nL0; i++ {
		band := base.SeqNum(200000 + (nL0-i)*1000) // i == 0 is the newest
		start := rng.IntN(keySpace - 1)
		end := start + 1 + rng.IntN(min(300, keySpace-1-start))
		f := &manifest.FileMetadata{
			FileNum:  num,
			Size:     uint64(1+rng.IntN(4<<10)) << 10,
			Smallest: base.MakeInternalKey(userKey(start), band+base.SeqNum(rng.IntN(500)), base.KindSet),
			Largest:  base.MakeInternalKey(userKey(end), band+500+base.SeqNum(rng.IntN(500)), base.KindSet),
		}
		if rng.IntN(4) == 0 {
			f.Largest = base.MakeRangeDeleteSentinel(userKey(end))
		}
		f.SmallestSeq, f.LargestSeq = band, band+999
		num++
		v.Levels[0] = append(v.Levels[0], f)
	}
	// A few files held by something outside the picker's knowledge.
	for l := range v.Levels {
		for _, f := range v.Levels[l] {
			if rng.IntN(25) == 0 {
				f.Compacting = true
			}
		}
	}
	return v
}

func checkLevelsValid(t *testing.T, v *LevelsView) {
	t.Helper()
	for l := 1; l < manifest.NumLevels; l++ {
		files := v.Levels[l]
		for i := 1; i < len(files); i++ {
			if base.CompareInternal(files[i-1].Largest, files[i].Smallest) >= 0 {
				t.Fatalf("L%d: %s and %s overlap or are unsorted", l, files[i-1], files[i])
			}
		}
	}
}

func indexOf(files []*manifest.FileMetadata, f *manifest.FileMetadata) int {
	return slices.Index(files, f)
}

// checkCompaction verifies the picker's guarantees for c, picked from v with
// running compactions inProgress.
func checkCompaction(t *testing.T, p *Picker, v *LevelsView, c *Compaction, inProgress []*Compaction, manual bool) {
	t.Helper()
	opts := p.Options()
	baseLevel, _ := p.LevelTargets(v)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s: %s", c, fmt.Sprintf(format, args...))
	}
	switch {
	case c.StartLevel == 0:
		if c.OutputLevel != baseLevel {
			fail("L0 output level %d, base level %d", c.OutputLevel, baseLevel)
		}
		// L0 data must not land below older data in a higher level.
		for l := 1; l < c.OutputLevel; l++ {
			if len(v.Levels[l]) > 0 {
				fail("L0 compacts into L%d below non-empty L%d", c.OutputLevel, l)
			}
		}
	case c.StartLevel == lastLevel:
		if !manual || c.OutputLevel != lastLevel {
			fail("bad last-level compaction")
		}
	default:
		if c.OutputLevel != c.StartLevel+1 {
			fail("output level %d", c.OutputLevel)
		}
	}
	if manual != (c.Kind == KindManual) {
		fail("kind %s (manual=%v)", c.Kind, manual)
	}
	if len(c.StartFiles()) == 0 {
		fail("no start inputs")
	}
	if c.StartLevel == c.OutputLevel && len(c.Inputs) > 1 {
		fail("in-place compaction with output inputs")
	}
	seen := map[*manifest.FileMetadata]bool{}
	var inputs []*manifest.FileMetadata
	for _, in := range c.Inputs {
		inputs = append(inputs, in.Files...)
		for _, f := range in.Files {
			if f.Compacting {
				fail("picked compacting file %s", f)
			}
			if seen[f] {
				fail("duplicate input %s", f)
			}
			seen[f] = true
			if indexOf(v.Levels[in.Level], f) < 0 {
				fail("input %s not in L%d", f, in.Level)
			}
		}
	}

	// Key range.
	for _, f := range inputs {
		if base.CompareInternal(f.Smallest, c.Smallest) < 0 || base.CompareInternal(f.Largest, c.Largest) > 0 {
			fail("range does not cover %s", f)
		}
	}
	if !slices.ContainsFunc(inputs, func(f *manifest.FileMetadata) bool {
		return base.CompareInternal(f.Smallest, c.Smallest) == 0
	}) || !slices.ContainsFunc(inputs, func(f *manifest.FileMetadata) bool {
		return base.CompareInternal(f.Largest, c.Largest) == 0
	}) {
		fail("range wider than inputs")
	}

	// Clean cut of the start level.
	start := v.Levels[c.StartLevel]
	for gi, g := range start {
		if seen[g] {
			continue
		}
		for _, f := range c.StartFiles() {
			if !refOverlap(f, g) {
				continue
			}
			if c.StartLevel > 0 {
				fail("start-level file %s left behind overlaps input %s", g, f)
			}
			if gi > indexOf(start, f) {
				fail("older L0 file %s left behind overlaps input %s", g, f)
			}
		}
	}
	// Output level: everything overlapping any input is an input.
	if c.StartLevel != c.OutputLevel {
		for _, g := range v.Levels[c.OutputLevel] {
			if seen[g] {
				continue
			}
			for _, f := range inputs {
				if refOverlap(f, g) {
					fail("output-level file %s overlaps input %s but is not an input", g, f)
				}
			}
			if refRangeOverlap(c.Smallest, c.Largest, g.Smallest, g.Largest) {
				fail("output-level file %s inside the range is not an input", g)
			}
		}
	}
	// Grandparents and bottommost.
	var wantGP []*manifest.FileMetadata
	if c.OutputLevel < lastLevel {
		for _, g := range v.Levels[c.OutputLevel+1] {
			if refRangeOverlap(c.Smallest, c.Largest, g.Smallest, g.Largest) {
				wantGP = append(wantGP, g)
			}
		}
	}
	if !slices.Equal(wantGP, c.Grandparents) {
		fail("grandparents %v, want %v", c.Grandparents, wantGP)
	}
	below := false
	for l := c.OutputLevel + 1; l < manifest.NumLevels; l++ {
		for _, g := range v.Levels[l] {
			if refRangeOverlap(c.Smallest, c.Largest, g.Smallest, g.Largest) {
				below = true
			}
		}
	}
	if c.Bottommost == below {
		fail("bottommost=%v but overlap below=%v", c.Bottommost, below)
	}
	// Concurrency.
	running := 0
	for _, r := range inProgress {
		if r == nil {
			continue
		}
		running++
		if c.StartLevel == 0 && r.StartLevel == 0 {
			fail("second L0 compaction alongside %s", r)
		}
		if r.OutputLevel == c.OutputLevel && refRangeOverlap(r.Smallest, r.Largest, c.Smallest, c.Largest) {
			fail("writes L%d over the range of running %s", c.OutputLevel, r)
		}
		for _, in := range r.Inputs {
			for _, f := range in.Files {
				if seen[f] {
					fail("shares input %s with running %s", f, r)
				}
			}
		}
	}
	if !manual {
		if running >= opts.MaxConcurrentCompactions {
			fail("%d running, limit %d", running, opts.MaxConcurrentCompactions)
		}
		if c.Score < 1 {
			fail("score %.2f < 1", c.Score)
		}
	}
	if c.Kind == KindMove {
		if len(c.StartFiles()) != 1 || len(c.OutputFiles()) != 0 || c.StartLevel == c.OutputLevel ||
			totalSize(c.Grandparents) > c.MaxGrandparentOverlapBytes {
			fail("invalid move")
		}
	}
	if c.MaxOutputFileSize != opts.TargetFileSize[c.OutputLevel] {
		fail("max output %d", c.MaxOutputFileSize)
	}
}

func markCompacting(c *Compaction, on bool) {
	for _, in := range c.Inputs {
		for _, f := range in.Files {
			f.Compacting = on
		}
	}
}

// TestRandomPickInvariants picks repeatedly from random views, keeping the
// picked compactions running, and checks every result against the picker's
// guarantees.
func TestRandomPickInvariants(t *testing.T) {
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	picks := 0
	for iter := 0; iter < 400; iter++ {
		p := NewPicker(randomOptions(rng))
		v := randomView(rng)
		checkLevelsValid(t, v)
		var running []*Compaction
		for step := 0; step < 40; step++ {
			switch r := rng.IntN(10); {
			case r < 6:
				c := p.Pick(v, running)
				if c == nil {
					continue
				}
				checkCompaction(t, p, v, c, running, false)
				markCompacting(c, true)
				running = append(running, c)
				picks++
			case r < 8:
				level := rng.IntN(manifest.NumLevels)
				var start, end []byte
				if rng.IntN(3) > 0 {
					start = userKey(rng.IntN(1000))
				}
				if rng.IntN(3) > 0 {
					end = userKey(rng.IntN(1000))
				}
				if start != nil && end != nil && bytes.Compare(start, end) > 0 {
					start, end = end, start
				}
				c, err := p.PickManual(v, level, start, end, running)
				if err != nil || c == nil {
					continue
				}
				checkCompaction(t, p, v, c, running, true)
				// The inputs must include every file of the level in range.
				s := span{start: start, end: end, unboundedStart: start == nil, unboundedEnd: end == nil}
				if level == 0 || level == lastLevel {
					for _, f := range v.Levels[level] {
						if fileSpan(f).overlaps(s) && indexOf(c.StartFiles(), f) < 0 {
							t.Fatalf("%s: misses %s in range", c, f)
						}
					}
				}
				markCompacting(c, true)
				running = append(running, c)
				picks++
			default:
				if len(running) > 0 {
					i := rng.IntN(len(running))
					markCompacting(running[i], false)
					running = slices.Delete(running, i, i+1)
				}
			}
		}
	}
	if picks == 0 {
		t.Fatal("no compaction was ever picked")
	}
	t.Logf("%d compactions checked", picks)
}

// simFile is a file of the simulated LSM: one version per user key.
type simEntry struct {
	key []byte
	seq base.SeqNum
	val base.SeqNum // the sequence number the value was written with
}

// TestSimulatedLSM runs a model LSM: random flushes into L0 and compactions
// chosen by the picker, completed in random order (so several run at once),
// with outputs cut by ShouldSplitBefore and sequence numbers zeroed when
// bottommost. After every step it checks that levels stay sorted and
// non-overlapping, that every key's versions are newest-first in read order,
// and that a read finds the latest write. At the end it drains the tree and
// checks that no level is left over its target.
func TestSimulatedLSM(t *testing.T) {
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	var st simStats
	for round := 0; round < 8; round++ {
		runSimulation(t, rng, &st, Leveled)
	}
	t.Logf("%+v", st)
	if st.compactions == 0 || st.maxRunning < 2 || st.moves == 0 || st.bottommost == 0 || st.levelsUsed < 4 {
		t.Fatalf("simulation did not exercise enough: %+v", st)
	}
}

type simStats struct {
	compactions, moves, bottommost, l0, maxRunning, levelsUsed, splits, multiLevel int
}

func runSimulation(t *testing.T, rng *rand.Rand, stats *simStats, style Style) {
	const entrySize = 64 << 10
	opts := Options{
		L0CompactionTrigger:      2 + rng.IntN(3),
		LBaseMaxBytes:            uint64(1+rng.IntN(4)) << 20,
		LevelMultiplier:          float64(3 + rng.IntN(4)),
		DynamicLevelBytes:        rng.IntN(3) != 0,
		MaxConcurrentCompactions: 1 + rng.IntN(4),
		Style:                    style,
	}
	if style == Universal {
		opts.Universal = UniversalOptions{
			SizeRatio:                   rng.IntN(20),
			MaxMergeWidth:               rng.IntN(6),
			MaxSizeAmplificationPercent: 50 + rng.IntN(300),
		}
	}
	opts.TargetFileSize[0] = uint64(128+rng.IntN(512)) << 10
	p := NewPicker(opts)
	keySpace := 300 + rng.IntN(1500)

	v := &LevelsView{}
	entries := map[*manifest.FileMetadata][]simEntry{}
	latest := map[string]base.SeqNum{}
	var seq base.SeqNum
	var num manifest.FileNum
	var running []*Compaction
	checkPicked := func(c *Compaction, running []*Compaction) {
		t.Helper()
		if style == Universal {
			checkUniversalCompaction(t, p, v, c, running)
		} else {
			checkCompaction(t, p, v, c, running, false)
		}
	}

	newFile := func(es []simEntry) *manifest.FileMetadata {
		num++
		f := &manifest.FileMetadata{
			FileNum:  num,
			Size:     uint64(len(es)) * entrySize,
			Smallest: base.MakeInternalKey(es[0].key, es[0].seq, base.KindSet),
			Largest:  base.MakeInternalKey(es[len(es)-1].key, es[len(es)-1].seq, base.KindSet),
		}
		f.SmallestSeq, f.LargestSeq = base.MaxSeqNum, 0
		for _, e := range es {
			f.SmallestSeq = min(f.SmallestSeq, e.seq)
			f.LargestSeq = max(f.LargestSeq, e.seq)
		}
		entries[f] = es
		return f
	}
	flush := func() {
		n := 1 + rng.IntN(40)
		lo := rng.IntN(keySpace)
		width := 1 + rng.IntN(keySpace)
		m := map[string]simEntry{}
		for i := 0; i < n; i++ {
			k := userKey((lo + rng.IntN(width)) % keySpace)
			seq++
			m[string(k)] = simEntry{key: k, seq: seq, val: seq}
			latest[string(k)] = seq
		}
		es := make([]simEntry, 0, len(m))
		for _, e := range m {
			es = append(es, e)
		}
		slices.SortFunc(es, func(a, b simEntry) int { return bytes.Compare(a.key, b.key) })
		v.Levels[0] = slices.Insert(v.Levels[0], 0, newFile(es))
	}
	complete := func(i int) {
		c := running[i]
		stats.compactions++
		if c.Kind == KindMove {
			stats.moves++
		}
		if c.Bottommost {
			stats.bottommost++
		}
		if c.StartLevel == 0 {
			stats.l0++
		}
		if len(c.Inputs) > 2 {
			stats.multiLevel++
		}
		stats.levelsUsed = max(stats.levelsUsed, lastLevel-c.OutputLevel+1)
		stats.maxRunning = max(stats.maxRunning, len(running))
		running = slices.Delete(running, i, i+1)
		markCompacting(c, false)
		remove := func(l int, f *manifest.FileMetadata) {
			j := indexOf(v.Levels[l], f)
			if j < 0 {
				t.Fatalf("%s: input %s vanished from L%d", c, f, l)
			}
			v.Levels[l] = slices.Delete(v.Levels[l], j, j+1)
		}
		var outputs []*manifest.FileMetadata
		if c.Kind == KindMove {
			remove(c.StartLevel, c.StartFiles()[0])
			outputs = append(outputs, c.StartFiles()[0])
		} else {
			// Merge: the newest version of each key wins (no snapshots).
			newest := map[string]simEntry{}
			for _, in := range c.Inputs {
				for _, f := range in.Files {
					remove(in.Level, f)
					for _, e := range entries[f] {
						if cur, ok := newest[string(e.key)]; !ok || e.val > cur.val {
							newest[string(e.key)] = e
						}
					}
					delete(entries, f)
				}
			}
			merged := make([]simEntry, 0, len(newest))
			for _, e := range newest {
				if c.Bottommost {
					e.seq = 0
				}
				merged = append(merged, e)
			}
			slices.SortFunc(merged, func(a, b simEntry) int { return bytes.Compare(a.key, b.key) })
			var cur []simEntry
			for _, e := range merged {
				if c.ShouldSplitBefore(e.key, uint64(len(cur))*entrySize) {
					outputs = append(outputs, newFile(cur))
					cur = nil
				}
				cur = append(cur, e)
			}
			if len(cur) > 0 {
				outputs = append(outputs, newFile(cur))
			}
			stats.splits += max(len(outputs)-1, 0)
			for _, o := range outputs {
				if o.Size > c.MaxOutputFileSize+entrySize {
					t.Fatalf("%s: output %s of %d bytes exceeds %d", c, o, o.Size, c.MaxOutputFileSize)
				}
			}
		}
		lvl := v.Levels[c.OutputLevel]
		lvl = append(lvl, outputs...)
		slices.SortFunc(lvl, func(a, b *manifest.FileMetadata) int { return base.CompareInternal(a.Smallest, b.Smallest) })
		v.Levels[c.OutputLevel] = lvl
	}
	check := func() {
		t.Helper()
		checkLevelsValid(t, v)
		// Versions of each key in read order must be strictly newest first,
		// and the first must be the latest write.
		type version struct {
			seq, val base.SeqNum
			level    int
			file     manifest.FileNum
		}
		versions := map[string][]version{}
		for l, files := range v.Levels {
			for _, f := range files {
				for _, e := range entries[f] {
					versions[string(e.key)] = append(versions[string(e.key)],
						version{e.seq, e.val, l, f.FileNum})
				}
			}
		}
		for k, vs := range versions {
			for i := 1; i < len(vs); i++ {
				if vs[i].seq >= vs[i-1].seq || vs[i].val >= vs[i-1].val {
					t.Fatalf("key %s: %v above %v out of order", k, vs[i-1], vs[i])
				}
			}
			if vs[0].val != latest[k] {
				t.Fatalf("key %s: read finds %d, latest is %d", k, vs[0].val, latest[k])
			}
		}
		if len(versions) != len(latest) {
			t.Fatalf("%d keys readable, %d written", len(versions), len(latest))
		}
	}

	steps := 300 + rng.IntN(500)
	for step := 0; step < steps; step++ {
		switch r := rng.IntN(10); {
		case r < 3 && len(v.Levels[0]) < p.Options().L0StopTrigger:
			flush()
		case r < 7:
			if c := p.Pick(v, running); c != nil {
				checkPicked(c, running)
				markCompacting(c, true)
				running = append(running, c)
			}
		default:
			if len(running) > 0 {
				complete(rng.IntN(len(running)))
			}
		}
		check()
	}
	// Drain: with no flushes, picking and completing must converge.
	for i := 0; ; i++ {
		if i > 100000 {
			t.Fatal("compactions do not converge")
		}
		if c := p.Pick(v, running); c != nil {
			checkPicked(c, running)
			markCompacting(c, true)
			running = append(running, c)
			continue
		}
		if len(running) == 0 {
			break
		}
		complete(rng.IntN(len(running)))
		check()
	}
	for l, s := range p.Scores(v) {
		if s >= 1 {
			t.Fatalf("L%d score %.2f after draining", l, s)
		}
	}
	// All scores < 1: L0 is below its triggers and every level within target.
	if debt := p.EstimatedPendingCompactionBytes(v); debt != 0 {
		t.Fatalf("debt %d after draining", debt)
	}
	if style == Universal {
		return
	}
	// Dynamic sizing: once drained, the base level is the ideal one (levels
	// that were the base only because they held data have drained).
	var sizes [manifest.NumLevels]uint64
	for l, files := range v.Levels {
		sizes[l] = totalSize(files)
	}
	baseLevel, ideal, _ := p.levelTargets(&sizes)
	if baseLevel != ideal {
		t.Fatalf("base level L%d, ideal L%d after draining", baseLevel, ideal)
	}
}
