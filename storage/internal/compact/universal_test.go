package compact

import (
	"math/rand/v2"
	"testing"

	"github.com/shale-db/shale/storage/manifest"
)

// checkUniversalCompaction checks a compaction the Universal style picked
// against rules written from the style's definition: its inputs are whole
// sorted runs, consecutive from newest to oldest, taking every older L0
// file once they take one; its output level lies above the next older run
// (the last level when none is left) and below every input; it shares
// nothing with a running compaction and writes no level one writes.
func checkUniversalCompaction(t *testing.T, p *Picker, v *LevelsView, c *Compaction, inProgress []*Compaction) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s: "+format, append([]any{c}, args...)...)
	}
	// The runs, newest first, from the view.
	type run struct {
		level int
		files []*manifest.FileMetadata
	}
	var runs []run
	for _, f := range v.Levels[0] {
		runs = append(runs, run{0, []*manifest.FileMetadata{f}})
	}
	for l := 1; l < manifest.NumLevels; l++ {
		if len(v.Levels[l]) > 0 {
			runs = append(runs, run{l, v.Levels[l]})
		}
	}
	in := map[*manifest.FileMetadata]bool{}
	for _, lf := range c.Inputs {
		for _, f := range lf.Files {
			if in[f] {
				fail("duplicate input %s", f)
			}
			if f.Compacting {
				fail("picked compacting file %s", f)
			}
			if indexOf(v.Levels[lf.Level], f) < 0 {
				fail("input %s not in L%d", f, lf.Level)
			}
			in[f] = true
		}
	}
	first, last := -1, -1
	for i, r := range runs {
		taken := 0
		for _, f := range r.files {
			if in[f] {
				taken++
			}
		}
		switch {
		case taken == 0:
			continue
		case taken != len(r.files):
			fail("takes %d of the %d files of the run at L%d", taken, len(r.files), r.level)
		case first >= 0 && last != i-1:
			fail("runs not consecutive")
		}
		if first < 0 {
			first = i
		}
		last = i
	}
	if first < 0 {
		fail("no inputs")
	}
	if runs[first].level != c.StartLevel {
		fail("start level L%d, newest input run at L%d", c.StartLevel, runs[first].level)
	}
	if runs[first].level == 0 && last+1 < len(runs) && runs[last+1].level == 0 {
		fail("leaves an older L0 file above its output")
	}
	if last+1 == len(runs) {
		if c.OutputLevel != lastLevel {
			fail("takes the oldest run but writes L%d", c.OutputLevel)
		}
	} else if c.OutputLevel >= runs[last+1].level || c.OutputLevel < runs[last].level || c.OutputLevel < 1 {
		fail("writes L%d, inputs down to L%d, next older run at L%d", c.OutputLevel, runs[last].level, runs[last+1].level)
	}
	for _, r := range inProgress {
		if r == nil {
			continue
		}
		if r.OutputLevel == c.OutputLevel {
			fail("writes L%d as running %s does", c.OutputLevel, r)
		}
		for _, lf := range r.Inputs {
			for _, f := range lf.Files {
				if in[f] {
					fail("shares %s with running %s", f, r)
				}
			}
		}
	}
	if c.Bottommost {
		for l := c.OutputLevel + 1; l < manifest.NumLevels; l++ {
			for _, f := range v.Levels[l] {
				if refRangeOverlap(f.Smallest, f.Largest, c.Smallest, c.Largest) {
					fail("bottommost, but L%d file %s overlaps", l, f)
				}
			}
		}
	}
	if c.MaxOutputFileSize != p.Options().TargetFileSize[c.OutputLevel] {
		fail("max output %d", c.MaxOutputFileSize)
	}
}

// TestSimulatedUniversal is TestSimulatedLSM for the Universal style: random
// flushes, compactions picked by the style and completed in random order,
// with every step checked (levels valid, each key's versions newest first,
// a read finds the latest write), and at the end a drained tree whose run
// count and size amplification are within bounds.
func TestSimulatedUniversal(t *testing.T) {
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	var st simStats
	for round := 0; round < 12; round++ {
		runSimulation(t, rng, &st, Universal)
	}
	t.Logf("%+v", st)
	if st.compactions == 0 || st.bottommost == 0 || st.multiLevel == 0 || st.maxRunning < 2 {
		t.Fatalf("simulation did not exercise enough: %+v", st)
	}
}
