package storage

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/vfs"
)

// ErrIncompatibleOptions is returned by Open when the options a database was
// made with (its OPTIONS file) name a comparator or merge operator other
// than the ones it is opened with: reading or compacting its data with them
// would give wrong answers.
var ErrIncompatibleOptions = errors.New("storage: options incompatible with the database")

// ErrNoOptionsFile is returned by ReadOptionsFile for a directory without
// an OPTIONS file (no database, or one written before they existed).
var ErrNoOptionsFile = errors.New("storage: no OPTIONS file")

// optionsFormat is the version of the OPTIONS file's layout.
const optionsFormat = 1

// StoredOptions are the settings a database was last opened for writing
// with, as its OPTIONS file records them.
type StoredOptions struct {
	// File is the OPTIONS file's name (OPTIONS-NNNNNN).
	File string
	// Options holds the recorded tunables. Its hooks (FS, Shared, Logger,
	// MergeOperator, CompactionFilter) are nil; PrefixExtractor is set when
	// the recorded one is a FixedPrefix.
	Options Options
	// Comparator, MergeOperator, CompactionFilter and PrefixExtractor are
	// the recorded names of the hooks ("" for none).
	Comparator, MergeOperator, CompactionFilter, PrefixExtractor string
	// Text is the file's content.
	Text string
}

// hookName returns h's Name, or "" for a nil hook.
func hookName[T interface{ Name() string }](h T, isNil bool) string {
	if isNil {
		return ""
	}
	return h.Name()
}

// encodeOptions renders o (defaults applied) as an OPTIONS file: sections of
// key=value lines, then a CRC-32C of everything before the checksum line.
func encodeOptions(o *Options) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Shale storage engine options, written by Open. Do not edit: the checksum guards it.\n")
	fmt.Fprintf(&b, "[engine]\n")
	kv := func(k string, v any) { fmt.Fprintf(&b, "%s=%v\n", k, v) }
	kv("format", optionsFormat)
	kv("comparator", comparatorName)
	kv("merge_operator", hookName(o.MergeOperator, o.MergeOperator == nil))
	kv("compaction_filter", hookName(o.CompactionFilter, o.CompactionFilter == nil))
	kv("prefix_extractor", hookName(o.PrefixExtractor, o.PrefixExtractor == nil))
	kv("memtable_size", o.MemTableSize)
	kv("memtable_initial_size", o.MemTableInitialSize)
	kv("max_memtables", o.MaxMemTables)
	kv("memtable_kind", o.MemTable)
	kv("l0_compaction_trigger", o.L0CompactionTrigger)
	kv("l0_slowdown_trigger", o.L0SlowdownTrigger)
	kv("l0_stop_trigger", o.L0StopTrigger)
	kv("lbase_max_bytes", o.LBaseMaxBytes)
	kv("level_multiplier", strconv.FormatFloat(o.LevelMultiplier, 'g', -1, 64))
	kv("dynamic_level_bytes", !o.DisableDynamicLevelBytes)
	kv("max_concurrent_compactions", o.MaxConcurrentCompactions)
	kv("compaction_style", o.Compaction)
	kv("universal_size_ratio", o.Universal.SizeRatio)
	kv("universal_min_merge_width", o.Universal.MinMergeWidth)
	kv("universal_max_merge_width", o.Universal.MaxMergeWidth)
	kv("universal_max_size_amplification_percent", o.Universal.MaxSizeAmplificationPercent)
	kv("wal_archive_max_bytes", o.WALArchiveMaxBytes)
	kv("wal_archive_ttl", o.WALArchiveTTL)
	kv("history_horizon", o.HistoryHorizon)
	// Written only when set, so that the OPTIONS file of a DB without a
	// window stays readable by engines that predate it.
	if o.HistoryWindow != 0 {
		kv("history_window", o.HistoryWindow)
	}
	if o.HistoryWindowBytes != 0 {
		kv("history_window_bytes", o.HistoryWindowBytes)
	}
	kv("wal_flush_threshold", o.WALFlushThreshold)
	kv("wal_preallocate_size", o.WALPreallocateSize)
	kv("write_pacing", !o.DisableWritePacing)
	kv("periodic_compaction", o.PeriodicCompaction)
	kv("at_rest_compaction_delay", o.AtRestCompactionDelay)
	for i, l := range o.Levels {
		fmt.Fprintf(&b, "[level %d]\n", i)
		kv("block_size", l.BlockSize)
		kv("block_restart_interval", l.BlockRestartInterval)
		kv("compression", l.Compression)
		kv("zstd_level", l.ZstdLevel)
		kv("filter_bits_per_key", l.filterBits())
		kv("target_file_size", l.TargetFileSize)
	}
	b.WriteString(optionsChecksumLine(b.Bytes()))
	return b.Bytes()
}

// optionsChecksumLine is the last line of an OPTIONS file whose preceding
// content is body.
func optionsChecksumLine(body []byte) string {
	return fmt.Sprintf("checksum=crc32c:%08x\n", crc32.Checksum(body, castagnoli))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// parseOptions reads an OPTIONS file's content back, checking its checksum
// and that every line is understood.
func parseOptions(data []byte) (*StoredOptions, error) {
	i := bytes.LastIndex(data, []byte("checksum="))
	if i < 0 || (i > 0 && data[i-1] != '\n') {
		return nil, errors.New("no checksum line")
	}
	line := strings.TrimSpace(string(data[i:]))
	var want uint32
	if _, err := fmt.Sscanf(line, "checksum=crc32c:%08x", &want); err != nil {
		return nil, fmt.Errorf("malformed checksum line %q", line)
	}
	if got := crc32.Checksum(data[:i], castagnoli); got != want {
		return nil, fmt.Errorf("checksum mismatch: content %08x, recorded %08x", got, want)
	}
	s := &StoredOptions{Text: string(data)}
	o := &s.Options
	section := ""
	level := -1
	sc := bufio.NewScanner(bytes.NewReader(data[:i]))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			level = -1
			if rest, ok := strings.CutPrefix(section, "level "); ok {
				l, err := strconv.Atoi(rest)
				if err != nil || l < 0 || l >= manifest.NumLevels {
					return nil, fmt.Errorf("line %d: unknown section %q", n, line)
				}
				level = l
			} else if section != "engine" {
				return nil, fmt.Errorf("line %d: unknown section %q", n, line)
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: %q is not key=value", n, line)
		}
		var err error
		if level >= 0 {
			err = setLevelOption(&o.Levels[level], k, v)
		} else if section == "engine" {
			err = s.setEngineOption(k, v)
		} else {
			err = errors.New("outside any section")
		}
		if err != nil {
			return nil, fmt.Errorf("line %d (%s): %w", n, k, err)
		}
	}
	if s.Comparator == "" {
		return nil, errors.New("no comparator recorded")
	}
	if n, ok := strings.CutPrefix(s.PrefixExtractor, "fixed:"); ok {
		if p, err := strconv.Atoi(n); err == nil && p > 0 {
			o.PrefixExtractor = FixedPrefix(p)
		}
	}
	return s, nil
}

func (s *StoredOptions) setEngineOption(k, v string) error {
	o := &s.Options
	var err error
	u := func(p *uint64) { *p, err = strconv.ParseUint(v, 10, 64) }
	i := func(p *int) { *p, err = strconv.Atoi(v) }
	i64 := func(p *int64) { *p, err = strconv.ParseInt(v, 10, 64) }
	notB := func(p *bool) {
		var b bool
		b, err = strconv.ParseBool(v)
		*p = !b
	}
	switch k {
	case "format":
		var f int
		i(&f)
		if err == nil && f != optionsFormat {
			err = fmt.Errorf("format %d, this engine reads %d", f, optionsFormat)
		}
	case "comparator":
		s.Comparator = v
	case "merge_operator":
		s.MergeOperator = v
	case "compaction_filter":
		s.CompactionFilter = v
	case "prefix_extractor":
		s.PrefixExtractor = v
	case "memtable_size":
		u(&o.MemTableSize)
	case "memtable_initial_size":
		u(&o.MemTableInitialSize)
	case "max_memtables":
		i(&o.MaxMemTables)
	case "memtable_kind":
		o.MemTable, err = parseNamed("memtable kind", v, SkiplistMemTable, VectorMemTable)
	case "l0_compaction_trigger":
		i(&o.L0CompactionTrigger)
	case "l0_slowdown_trigger":
		i(&o.L0SlowdownTrigger)
	case "l0_stop_trigger":
		i(&o.L0StopTrigger)
	case "lbase_max_bytes":
		u(&o.LBaseMaxBytes)
	case "level_multiplier":
		o.LevelMultiplier, err = strconv.ParseFloat(v, 64)
	case "dynamic_level_bytes":
		notB(&o.DisableDynamicLevelBytes)
	case "max_concurrent_compactions":
		i(&o.MaxConcurrentCompactions)
	case "compaction_style":
		o.Compaction, err = parseNamed("compaction style", v, LeveledCompaction, UniversalCompaction)
	case "universal_size_ratio":
		i(&o.Universal.SizeRatio)
	case "universal_min_merge_width":
		i(&o.Universal.MinMergeWidth)
	case "universal_max_merge_width":
		i(&o.Universal.MaxMergeWidth)
	case "universal_max_size_amplification_percent":
		i(&o.Universal.MaxSizeAmplificationPercent)
	case "wal_archive_max_bytes":
		i64(&o.WALArchiveMaxBytes)
	case "wal_archive_ttl":
		o.WALArchiveTTL, err = time.ParseDuration(v)
	case "history_horizon":
		o.HistoryHorizon, err = strconv.ParseBool(v)
	case "history_window":
		o.HistoryWindow, err = time.ParseDuration(v)
	case "history_window_bytes":
		i64(&o.HistoryWindowBytes)
	case "wal_flush_threshold":
		i(&o.WALFlushThreshold)
	case "wal_preallocate_size":
		i64(&o.WALPreallocateSize)
	case "write_pacing":
		notB(&o.DisableWritePacing)
	case "periodic_compaction":
		o.PeriodicCompaction, err = time.ParseDuration(v)
	case "at_rest_compaction_delay":
		o.AtRestCompactionDelay, err = time.ParseDuration(v)
	default:
		// A later engine's option: an older engine cannot honour it.
		err = errors.New("unknown option")
	}
	return err
}

func setLevelOption(l *LevelOptions, k, v string) error {
	var err error
	i := func(p *int) { *p, err = strconv.Atoi(v) }
	switch k {
	case "block_size":
		i(&l.BlockSize)
	case "block_restart_interval":
		i(&l.BlockRestartInterval)
	case "compression":
		l.Compression, err = parseCompression(v)
	case "zstd_level":
		i(&l.ZstdLevel)
	case "filter_bits_per_key":
		i(&l.FilterBitsPerKey)
		if err == nil && l.FilterBitsPerKey == 0 {
			l.FilterBitsPerKey = -1 // recorded "none": 0 would mean the default
		}
	case "target_file_size":
		l.TargetFileSize, err = strconv.ParseUint(v, 10, 64)
	default:
		err = errors.New("unknown option")
	}
	return err
}

// parseCompression is the inverse of Compression.String.
func parseCompression(s string) (Compression, error) {
	return parseNamed("compression", s, NoCompression, SnappyCompression, ZstdCompression, ZstdDictCompression)
}

// parseNamed returns the choice whose String is s, or an "unknown what"
// error.
func parseNamed[T fmt.Stringer](what, s string, choices ...T) (T, error) {
	for _, c := range choices {
		if c.String() == s {
			return c, nil
		}
	}
	var zero T
	return zero, fmt.Errorf("unknown %s %q", what, s)
}

// newestOptionsFile returns the name and number of the highest-numbered
// OPTIONS file in dir (ok false when there is none).
func newestOptionsFile(fs vfs.FS, dir string) (name string, num manifest.FileNum, ok bool, err error) {
	names, err := fs.List(dir)
	if err != nil {
		return "", 0, false, fmt.Errorf("list %s: %w", dir, err)
	}
	for _, n := range names {
		ft, fn, isFile := manifest.ParseFilename(n)
		if isFile && ft == manifest.FileTypeOptions && (!ok || fn > num) {
			name, num, ok = n, fn, true
		}
	}
	return name, num, ok, nil
}

// ReadOptionsFile returns the options recorded in the newest OPTIONS file of
// the database in dir: those it was last opened for writing with. It
// returns ErrNoOptionsFile when there is none, and an error naming the file
// when it is corrupt (its checksum does not match) or unreadable.
func ReadOptionsFile(fs vfs.FS, dir string) (*StoredOptions, error) {
	if fs == nil {
		fs = vfs.Default
	}
	name, _, ok, err := newestOptionsFile(fs, dir)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%s: %w", dir, ErrNoOptionsFile)
	}
	path := fs.Join(dir, name)
	f, err := fs.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	s, err := parseOptions(data)
	if err != nil {
		return nil, fmt.Errorf("%s is corrupt (delete it to open the database with the options given): %w", path, err)
	}
	s.File = name
	return s, nil
}

// checkStoredOptions refuses to open the database in d.dirname with a
// comparator or merge operator other than those its OPTIONS file records.
// A read-only open without a merge operator is allowed: it reads every
// record but merges (which fail as they do without an operator). It
// returns the newest OPTIONS file's number and content (ok false when there
// is none).
func (d *DB) checkStoredOptions() (num manifest.FileNum, text []byte, ok bool, err error) {
	name, num, ok, err := newestOptionsFile(d.fs, d.dirname)
	if err != nil || !ok {
		return 0, nil, false, err
	}
	s, err := ReadOptionsFile(d.fs, d.dirname)
	if err != nil {
		return 0, nil, false, err
	}
	if s.Comparator != comparatorName {
		return 0, nil, false, fmt.Errorf("%w: %s records comparator %q, this engine has %q", ErrIncompatibleOptions, name, s.Comparator, comparatorName)
	}
	if s.MergeOperator != "" {
		have := hookName(d.opts.MergeOperator, d.opts.MergeOperator == nil)
		if have != s.MergeOperator && !(have == "" && d.readOnly) {
			if have == "" {
				have = "none"
			}
			return 0, nil, false, fmt.Errorf("%w: %s records merge operator %q, opened with %s", ErrIncompatibleOptions, name, s.MergeOperator, have)
		}
	}
	return num, []byte(s.Text), true, nil
}

// writeOptionsFile records d's options in a new OPTIONS file (written under
// a temporary name, synced, renamed and the directory synced), unless the
// newest one already holds exactly them. Older OPTIONS files are deleted
// with the other obsolete files. Called during open, before any background
// work starts.
func (d *DB) writeOptionsFile(prevNum manifest.FileNum, prev []byte, hasPrev bool) error {
	data := encodeOptions(d.opts)
	if hasPrev && bytes.Equal(prev, data) {
		d.optionsNum = prevNum
		return nil
	}
	d.mu.Lock()
	num := d.nextFileNum
	d.nextFileNum++
	d.mu.Unlock()
	tmp := manifest.MakeFilepath(d.fs, d.dirname, manifest.FileTypeTemp, num)
	path := manifest.MakeFilepath(d.fs, d.dirname, manifest.FileTypeOptions, num)
	f, err := d.fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = d.fs.Rename(tmp, path)
	}
	if err != nil {
		_ = d.fs.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	dir, err := d.fs.OpenDir(d.dirname)
	if err != nil {
		return fmt.Errorf("sync %s: %w", d.dirname, err)
	}
	err = dir.Sync()
	if cerr := dir.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", d.dirname, err)
	}
	d.optionsNum = num
	return nil
}
