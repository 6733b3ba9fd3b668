package backup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"regexp"
	"time"
)

// FormatVersion is the manifest format this package writes and reads.
const FormatVersion = 1

// ErrCorrupt is wrapped by every error about a manifest or stored file
// whose contents are wrong (bad checksum, bad size, malformed JSON).
var ErrCorrupt = errors.New("backup: corrupt")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Manifest describes one complete backup.
type Manifest struct {
	// Format is FormatVersion.
	Format int `json:"format"`
	// ID names the backup in its location.
	ID string `json:"id"`
	// ClusterID is the backed-up cluster's ID.
	ClusterID string `json:"cluster_id"`
	// Started and Finished bound the time the backup was taken in.
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Shards holds one part per shard, the system shard's included, by
	// start key (the system shard first).
	Shards []Part `json:"shards"`
}

// Part is one shard's checkpoint in a backup.
type Part struct {
	ShardID uint64 `json:"shard_id"`
	// System marks the system shard (cluster metadata, no user keys).
	System bool `json:"system,omitempty"`
	// Start and End bound the user keys the part holds (End empty: no
	// upper bound).
	Start []byte `json:"start"`
	End   []byte `json:"end"`
	// Epoch is the shard's range epoch at the checkpoint.
	Epoch uint64 `json:"epoch"`
	// Descriptor is the shard's descriptor at the checkpoint, as protojson.
	Descriptor json.RawMessage `json:"descriptor"`
	// NodeID is the node whose replica was copied.
	NodeID uint64 `json:"node_id"`
	// AppliedIndex and AppliedTerm are the Raft position the copy holds.
	AppliedIndex uint64 `json:"applied_index"`
	AppliedTerm  uint64 `json:"applied_term"`
	// Date is the hybrid-logical-clock date of the last entry the copy
	// holds.
	Date HLC `json:"date"`
	// Files are the checkpoint's files.
	Files []File `json:"files"`
	// Log are the entries the shard applied after the checkpoint, in
	// segments that follow one another (incremental backups add them).
	Log []Segment `json:"log,omitempty"`
	// Until is when the backup last read the shard (the backup tool's
	// clock): the part holds every entry the shard applied before then.
	Until time.Time `json:"until"`
}

// Segment is a stored run of a shard's log: entries FromIndex to ToIndex,
// dated FirstDate to LastDate.
type Segment struct {
	File
	FromIndex uint64 `json:"from_index"`
	ToIndex   uint64 `json:"to_index"`
	FirstDate HLC    `json:"first_date"`
	LastDate  HLC    `json:"last_date"`
}

// LastIndex is the last entry the part holds: its log's last, or the
// checkpoint's applied index.
func (p *Part) LastIndex() uint64 {
	if len(p.Log) > 0 {
		return p.Log[len(p.Log)-1].ToIndex
	}
	return p.AppliedIndex
}

// LastDate is the date of the last entry the part holds.
func (p *Part) LastDate() HLC {
	if len(p.Log) > 0 {
		return p.Log[len(p.Log)-1].LastDate
	}
	return p.Date
}

// stored lists every stored file the part uses: checkpoint files, then log
// segments.
func (p *Part) stored() []File {
	out := append([]File(nil), p.Files...)
	for _, s := range p.Log {
		out = append(out, s.File)
	}
	return out
}

// HLC is a hybrid logical clock reading.
type HLC struct {
	WallNanos int64  `json:"wall_nanos"`
	Logical   uint32 `json:"logical"`
}

// After reports whether h is later than the wall time t (any logical count
// at t's wall time is not later).
func (h HLC) After(t time.Time) bool { return h.WallNanos > t.UnixNano() }

// Time is the wall-clock part of h.
func (h HLC) Time() time.Time { return time.Unix(0, h.WallNanos).UTC() }

// File is one file of a checkpoint.
type File struct {
	// Name is the file's name in the checkpoint.
	Name string `json:"name"`
	// Size and CRC32C describe its contents.
	Size   uint64 `json:"size"`
	CRC32C uint32 `json:"crc32c"`
	// Path is where it is stored, relative to the location.
	Path string `json:"path"`
}

// Bytes is the total size of the part's files.
func (p *Part) Bytes() uint64 {
	var n uint64
	for _, f := range p.stored() {
		n += f.Size
	}
	return n
}

// Bytes is the total size of the backup's files.
func (m *Manifest) Bytes() uint64 {
	var n uint64
	for i := range m.Shards {
		n += m.Shards[i].Bytes()
	}
	return n
}

// sealed is the manifest file: the body and the CRC-32C of its compact
// JSON encoding.
type sealed struct {
	Body   json.RawMessage `json:"body"`
	CRC32C uint32          `json:"crc32c"`
}

// encodeManifest returns the manifest file's bytes.
func encodeManifest(m *Manifest) ([]byte, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(sealed{Body: body, CRC32C: crc32.Checksum(body, castagnoli)}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// DecodeManifest parses a manifest file, checking its checksum, its format
// and that its contents are consistent; any defect is an error wrapping
// ErrCorrupt.
func DecodeManifest(b []byte) (*Manifest, error) {
	var s sealed
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%w: manifest: %v", ErrCorrupt, err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, s.Body); err != nil {
		return nil, fmt.Errorf("%w: manifest body: %v", ErrCorrupt, err)
	}
	if got := crc32.Checksum(compact.Bytes(), castagnoli); got != s.CRC32C {
		return nil, fmt.Errorf("%w: manifest checksum %08x, recorded %08x", ErrCorrupt, got, s.CRC32C)
	}
	m := &Manifest{}
	if err := json.Unmarshal(s.Body, m); err != nil {
		return nil, fmt.Errorf("%w: manifest body: %v", ErrCorrupt, err)
	}
	if m.Format != FormatVersion {
		return nil, fmt.Errorf("%w: manifest format %d, this version reads %d", ErrCorrupt, m.Format, FormatVersion)
	}
	if err := ValidID(m.ID); err != nil {
		return nil, fmt.Errorf("%w: manifest: %v", ErrCorrupt, err)
	}
	for i := range m.Shards {
		p := &m.Shards[i]
		next := p.AppliedIndex + 1
		for _, seg := range p.Log {
			if seg.FromIndex != next || seg.ToIndex < seg.FromIndex {
				return nil, fmt.Errorf("%w: shard %d: log segment %d-%d does not follow entry %d", ErrCorrupt, p.ShardID, seg.FromIndex, seg.ToIndex, next-1)
			}
			next = seg.ToIndex + 1
		}
		for _, f := range p.stored() {
			if err := validFileName(f.Name); err != nil {
				return nil, fmt.Errorf("%w: shard %d: %v", ErrCorrupt, p.ShardID, err)
			}
			if f.Path != storedPath(p.ShardID, f.Name, f.Size, f.CRC32C) {
				return nil, fmt.Errorf("%w: shard %d: file %s stored at %q", ErrCorrupt, p.ShardID, f.Name, f.Path)
			}
		}
	}
	return m, nil
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidID reports whether id can name a backup: 1 to 128 letters, digits,
// '.', '_' or '-', not starting with a punctuation mark.
func ValidID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("backup ID %q: want 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit", id)
	}
	return nil
}

// validFileName accepts a checkpoint file's name: a plain name, no path.
func validFileName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 255 {
		return fmt.Errorf("bad file name %q", name)
	}
	for _, c := range name {
		if c == '/' || c == '\\' || c == 0 {
			return fmt.Errorf("bad file name %q", name)
		}
	}
	return nil
}

// storedPath is where a checkpoint file is stored, relative to the
// location (always with forward slashes).
func storedPath(shardID uint64, name string, size uint64, crc uint32) string {
	return fmt.Sprintf("files/shard-%d/%s.%d.%08x", shardID, name, size, crc)
}
