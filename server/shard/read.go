package shard

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/storage"
)

// DefaultScanMaxBytes is the page size bound of Scan when
// ScanParams.MaxBytes is not positive.
const DefaultScanMaxBytes = 4 << 20

// readView is one consistent point of the engine for a read: a snapshot,
// plus the descriptor in force. release must be called when done.
type readView struct {
	snap *storage.Snapshot
	desc *shalev1.ShardDescriptor
	s    *Shard
}

// view pins the engine (against Restore and Close) and takes a snapshot.
func (s *Shard) view() (*readView, error) {
	s.dbMu.RLock()
	if s.db == nil {
		s.dbMu.RUnlock()
		return nil, ErrClosed
	}
	return &readView{snap: s.db.NewSnapshot(), desc: s.st.Load().desc, s: s}, nil
}

func (v *readView) release() {
	_ = v.snap.Close()
	v.s.dbMu.RUnlock()
}

// userRange returns the shard's user-key range, or an error for a replica
// without one (uninitialized or the system shard).
func (v *readView) userRange() (keyRange, error) {
	if v.desc == nil {
		return keyRange{}, ErrUninitialized
	}
	if v.desc.GetSystem() {
		return keyRange{}, fmt.Errorf("%w: the system shard holds no user keys", ErrKeyOutsideShard)
	}
	return shardRange(v.desc), nil
}

// revision reads the shard revision at the view's point.
func (v *readView) revision() (uint64, error) {
	ai, err := readApplied(v.snap)
	return ai.rev, err
}

// get reads one user key at the view's point; nil when absent or expired.
func (v *readView) get(key []byte, now int64) (*shalev1.KeyValue, error) {
	raw, ok, err := getOpt(v.snap, dataKey(key))
	if err != nil || !ok {
		return nil, err
	}
	return storedKeyValue(key, raw, now)
}

// storedKeyValue is the user-visible form of key's stored record raw: nil
// when it expired at now. raw must be the caller's own copy (the engine's
// Get and MultiGet return one): the KeyValue's value is a slice of it, not
// a second copy of its bytes.
func storedKeyValue(key, raw []byte, now int64) (*shalev1.KeyValue, error) {
	sv, err := decodeValue(raw)
	if err != nil {
		return nil, fmt.Errorf("shard: key %q: %w", key, err)
	}
	if sv.expired(now) {
		return nil, nil
	}
	kv := keyValue(key, &sv, true)
	kv.Value = sv.value
	return kv, nil
}

// Get reads key at one point of the shard's history: it returns the key's
// value (nil when absent or expired at nowUnixNanos) and the shard revision
// at that same point. A key outside the shard's range returns an error
// wrapping ErrKeyOutsideShard.
func (s *Shard) Get(key []byte, nowUnixNanos int64) (*shalev1.KeyValue, uint64, error) {
	v, err := s.view()
	if err != nil {
		return nil, 0, err
	}
	defer v.release()
	rng, err := v.userRange()
	if err != nil {
		return nil, 0, err
	}
	if !rng.contains(key) {
		return nil, 0, fmt.Errorf("%w: key %q, shard [%q, %q)", ErrKeyOutsideShard, key, rng.start, rng.end)
	}
	kv, err := v.get(key, nowUnixNanos)
	if err != nil {
		return nil, 0, err
	}
	rev, err := v.revision()
	if err != nil {
		return nil, 0, err
	}
	return kv, rev, nil
}

// MultiGet reads keys at one point of the shard's history: kvs[i] is the
// value of keys[i] (nil when absent or expired at nowUnixNanos), and rev the
// revision at that point. Every key must be inside the shard's range
// (otherwise an error wrapping ErrKeyOutsideShard, and no results).
func (s *Shard) MultiGet(keys [][]byte, nowUnixNanos int64) (kvs []*shalev1.KeyValue, rev uint64, err error) {
	v, err := s.view()
	if err != nil {
		return nil, 0, err
	}
	defer v.release()
	rng, err := v.userRange()
	if err != nil {
		return nil, 0, err
	}
	for _, k := range keys {
		if !rng.contains(k) {
			return nil, 0, fmt.Errorf("%w: key %q, shard [%q, %q)", ErrKeyOutsideShard, k, rng.start, rng.end)
		}
	}
	// One engine MultiGet: one pass over the engine in key order.
	dkeys := make([][]byte, len(keys))
	for i, k := range keys {
		dkeys[i] = dataKey(k)
	}
	raws, errs := v.snap.MultiGet(dkeys)
	kvs = make([]*shalev1.KeyValue, len(keys))
	for i, k := range keys {
		switch {
		case errors.Is(errs[i], storage.ErrNotFound):
		case errs[i] != nil:
			return nil, 0, errs[i]
		default:
			if kvs[i], err = storedKeyValue(k, raws[i], nowUnixNanos); err != nil {
				return nil, 0, err
			}
		}
	}
	rev, err = v.revision()
	if err != nil {
		return nil, 0, err
	}
	return kvs, rev, nil
}

// ScanParams describe one page of a range scan.
type ScanParams struct {
	// Start and End bound the range [Start, End); an empty End is the end of
	// the key space. The range is clipped to the shard's range.
	Start, End []byte
	// Reverse returns keys in descending order.
	Reverse bool
	// Limit caps the number of keys returned; 0 or less means no cap.
	Limit int
	// KeysOnly omits values (the revisions are still returned).
	KeysOnly bool
	// MaxBytes caps the total key plus value bytes of the page: a key that
	// would take the page over it is left for the next page, except that the
	// first key is always returned. 0 or less means DefaultScanMaxBytes.
	MaxBytes int
	// Now is the time (Unix nanoseconds) expiry is judged at: keys expired
	// at Now are skipped.
	Now int64
}

// ScanPage is one page of a range scan.
type ScanPage struct {
	// KVs are the page's keys, in scan order.
	KVs []*shalev1.KeyValue
	// More is true when the page stopped early, within the asked range
	// clipped to the shard's: ResumeKey says where to continue, the first
	// key not yet read (forward: the next page's Start) or the last key
	// returned (reverse: the next page's exclusive End). More can be true
	// when the keys left are all expired.
	More      bool
	ResumeKey []byte
	// Revision is the shard revision at the scan's point.
	Revision uint64
	// Start and End are the shard's range at the scan's point (a nil End is
	// the end of the key space): the page covers the asked range clipped to
	// them, and what the asked range holds beyond them is another shard's,
	// whatever descriptor the caller routed the scan by.
	Start, End []byte
}

// Scan returns one page of the keys in the range at one point of the
// shard's history, in key order (descending with Reverse), skipping expired
// keys, bounded by Limit and MaxBytes. A range with no overlap with the
// shard returns an error wrapping ErrKeyOutsideShard, unless it is empty
// itself.
func (s *Shard) Scan(p ScanParams) (page ScanPage, err error) {
	v, err := s.view()
	if err != nil {
		return ScanPage{}, err
	}
	defer v.release()
	rng, err := v.userRange()
	if err != nil {
		return ScanPage{}, err
	}
	page.Start, page.End = bytes.Clone(rng.start), bytes.Clone(rng.end)
	want := keyRange{start: p.Start, end: endOrNil(p.End)}
	if want.start == nil {
		want.start = []byte{}
	}
	page.Revision, err = v.revision()
	if err != nil {
		return ScanPage{}, err
	}
	if want.end != nil && bytes.Compare(want.start, want.end) >= 0 {
		return page, nil
	}
	r, ok := rng.intersect(want)
	if !ok {
		return ScanPage{}, fmt.Errorf("%w: range [%q, %q), shard [%q, %q)",
			ErrKeyOutsideShard, want.start, want.end, rng.start, rng.end)
	}
	maxBytes := p.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultScanMaxBytes
	}
	it, err := v.snap.NewIter(&storage.IterOptions{LowerBound: dataKey(r.start), UpperBound: dataBound(r.end)})
	if err != nil {
		return ScanPage{}, err
	}
	defer func() {
		if cerr := it.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	var size int
	valid, step := it.First, it.Next
	if p.Reverse {
		valid, step = it.Last, it.Prev
	}
	var kvs []*shalev1.KeyValue
	more := false
	for ok := valid(); ok; ok = step() {
		ek := it.Key()
		if p.Limit > 0 && len(kvs) >= p.Limit {
			more = true
			break
		}
		sv, derr := decodeValue(it.Value())
		if derr != nil {
			return ScanPage{}, fmt.Errorf("shard: key %q: %w", ek[1:], derr)
		}
		if sv.expired(p.Now) {
			continue
		}
		n := len(ek) - 1
		if !p.KeysOnly {
			n += len(sv.value)
		}
		if len(kvs) > 0 && size+n > maxBytes {
			more = true
			break
		}
		size += n
		kvs = append(kvs, keyValue(ek[1:], &sv, p.KeysOnly))
	}
	if err := it.Error(); err != nil {
		return ScanPage{}, fmt.Errorf("shard: scan: %w", err)
	}
	page.KVs, page.More = kvs, more
	if more {
		if p.Reverse {
			page.ResumeKey = bytes.Clone(kvs[len(kvs)-1].Key)
		} else {
			page.ResumeKey = bytes.Clone(it.Key()[1:])
		}
		if page.ResumeKey == nil {
			page.ResumeKey = []byte{}
		}
	}
	return page, nil
}

// SizeBytes returns the engine's on-disk size: the bytes of its SST files
// (memtables and WAL not counted), from its current version: no I/O, so
// the node may ask it of every shard every second.
func (s *Shard) SizeBytes() uint64 {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return 0
	}
	n, _ := s.db.SSTBytes()
	return n
}

// Nodes returns the node descriptors held by the system shard, by node ID,
// read at one point. It fails with ErrNotSystemShard on other shards.
func (s *Shard) Nodes() ([]*shalev1.NodeDescriptor, error) {
	var out []*shalev1.NodeDescriptor
	err := s.scanSystem(nodePrefix, func(b []byte) error {
		n := &shalev1.NodeDescriptor{}
		if err := proto.Unmarshal(b, n); err != nil {
			return err
		}
		out = append(out, n)
		return nil
	})
	return out, err
}

// AuthState returns the cluster's auth state held by the system shard, or
// nil when none was ever stored. It fails with ErrNotSystemShard on other
// shards.
func (s *Shard) AuthState() (*shalev1.AuthState, error) {
	var out *shalev1.AuthState
	err := s.scanSystem(authPrefix, func(b []byte) error {
		st := &shalev1.AuthState{}
		if err := proto.Unmarshal(b, st); err != nil {
			return err
		}
		out = st
		return nil
	})
	return out, err
}

// Shards returns the shard descriptors held by the system shard, by shard
// ID, read at one point. It fails with ErrNotSystemShard on other shards.
func (s *Shard) Shards() ([]*shalev1.ShardDescriptor, error) {
	var out []*shalev1.ShardDescriptor
	err := s.scanSystem(shardPrefix, func(b []byte) error {
		d := &shalev1.ShardDescriptor{}
		if err := proto.Unmarshal(b, d); err != nil {
			return err
		}
		out = append(out, d)
		return nil
	})
	return out, err
}

// Pins returns the shard pins held by the system shard, by shard ID, read
// at one point (expired pins included). It fails with ErrNotSystemShard on
// other shards.
func (s *Shard) Pins() ([]*shalev1.ShardPin, error) {
	var out []*shalev1.ShardPin
	err := s.scanSystem(pinPrefix, func(b []byte) error {
		p := &shalev1.ShardPin{}
		if err := proto.Unmarshal(b, p); err != nil {
			return err
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

// StoredResult returns the result this replica recorded when it applied
// the command with request ID id: ok is false when it applied none (as far
// as its applied state goes) or its deduplication table no longer holds
// it. Only commands that changed the shard are recorded; a command whose
// ID is found here must not be applied again.
func (s *Shard) StoredResult(id []byte) (res *shalev1.CommandResult, ok bool, err error) {
	v, err := s.view()
	if err != nil {
		return nil, false, err
	}
	defer v.release()
	raw, err := v.snap.Get(dedupKey(id))
	legacy := errors.Is(err, storage.ErrNotFound) && s.st.Load().dedupLegacyEnd != 0
	if legacy {
		// Perhaps an entry an older format wrote, while the shard holds
		// any (its eviction tells whether it is still live). Once the
		// table evicted the last of them, they are deleted and the bound
		// is 0: a miss costs no second read.
		raw, err = v.snap.Get(legacyDedupKey(id))
	}
	if errors.Is(err, storage.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read the result of request %x: %w", id, err)
	}
	ai, err := readApplied(v.snap)
	if err != nil {
		return nil, false, err
	}
	return decodeDedupEntry(id, raw, ai.dedupOldest, legacy)
}

func (s *Shard) scanSystem(prefix []byte, fn func([]byte) error) (err error) {
	v, err := s.view()
	if err != nil {
		return err
	}
	defer v.release()
	if v.desc == nil {
		return ErrUninitialized
	}
	if !v.desc.GetSystem() {
		return ErrNotSystemShard
	}
	it, err := v.snap.NewIter(&storage.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := it.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	for ok := it.First(); ok; ok = it.Next() {
		if err := fn(it.Value()); err != nil {
			return fmt.Errorf("%w: system record %q: %v", ErrCorrupt, it.Key(), err)
		}
	}
	return it.Error()
}

// Checksum returns a checksum of the shard's replicated data at one point:
// every user key with its stored record (value, revisions, expiry, expired
// keys included) and the system shard's records. Replicas that applied the
// same entries have equal checksums. It reads the whole shard; it is meant
// for tests and consistency checks.
func (s *Shard) Checksum() (uint64, error) {
	_, sum, err := s.ChecksumAt()
	return sum, err
}

// ChecksumAt is Checksum with the applied index it was taken at, read from
// the same point of the engine: replicas that report the same index must
// report the same checksum.
func (s *Shard) ChecksumAt() (applied, sum uint64, err error) {
	v, err := s.view()
	if err != nil {
		return 0, 0, err
	}
	defer v.release()
	ai, err := readApplied(v.snap)
	if err != nil {
		return 0, 0, err
	}
	applied = ai.index
	h := sha256.New()
	var lenBuf [binary.MaxVarintLen64]byte
	for _, span := range [][2][]byte{{{prefixData}, {prefixData + 1}}, {{prefixSystem}, {prefixSystem + 1}}} {
		if err := hashSpan(v.snap, span[0], span[1], func(k, val []byte) {
			h.Write(lenBuf[:binary.PutUvarint(lenBuf[:], uint64(len(k)))])
			h.Write(k)
			h.Write(lenBuf[:binary.PutUvarint(lenBuf[:], uint64(len(val)))])
			h.Write(val)
		}); err != nil {
			return 0, 0, err
		}
	}
	return applied, binary.BigEndian.Uint64(h.Sum(nil)), nil
}

// hashSpan calls fn for every engine key in [lo, hi) of snap, in order.
func hashSpan(snap *storage.Snapshot, lo, hi []byte, fn func(k, v []byte)) (err error) {
	it, err := snap.NewIter(&storage.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := it.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	for ok := it.First(); ok; ok = it.Next() {
		fn(it.Key(), it.Value())
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("shard: checksum: %w", err)
	}
	return nil
}

// EngineMetrics returns the storage engine's metrics, or nil while the
// shard is closed.
func (s *Shard) EngineMetrics() *storage.Metrics {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return nil
	}
	return s.db.Metrics()
}
