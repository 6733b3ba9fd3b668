package shard

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

func TestScanPagination(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "b", "y"), 0)
	f := newFeeder(s)
	rng := rand.New(rand.NewPCG(4, 4))
	now := ts0 + 1e9
	var ops []*shalev1.RequestOp
	for i := range 300 {
		k := fmt.Sprintf("c%03d", i)
		if i%50 == 0 {
			k = fmt.Sprintf("x%03d", i)
		}
		var ttl int64
		if rng.IntN(5) == 0 {
			ttl = 1 // expired at now
		}
		ops = append(ops, putOp(k, string(bytes.Repeat([]byte{'v'}, rng.IntN(300))), ttl, false))
		if len(ops) == 40 {
			applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: ops}))
			ops = nil
			if i == 159 {
				if _, err := s.Flush(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: ops}))
	// Records outside the shard's range, written behind the apply logic's
	// back, must never be returned.
	b := storage.NewBatch()
	for _, k := range []string{"a", "az", "y", "z"} {
		b.Set(dataKey([]byte(k)), encodeValue(nil, &storedValue{createRev: 1, modRev: 1, version: 1, value: []byte("outside")}))
	}
	if err := s.db.Apply(b, storage.NoSync); err != nil {
		t.Fatal(err)
	}

	page, err := s.Scan(ScanParams{Limit: 0, MaxBytes: 1 << 30, Now: now})
	all, more, rev := page.KVs, page.More, page.Revision
	if err != nil || more || rev != s.Revision() {
		t.Fatal(err, more, rev)
	}
	if len(all) < 200 || len(all) > 280 {
		t.Fatalf("%d live keys", len(all))
	}
	keys := make([]string, len(all))
	for i, kv := range all {
		keys[i] = string(kv.Key)
	}
	if !slices.IsSorted(keys) || keys[0] < "b" || keys[len(keys)-1] >= "y" {
		t.Fatalf("full scan out of order or range: %q ... %q", keys[0], keys[len(keys)-1])
	}
	byKey := map[string]*shalev1.KeyValue{}
	for _, kv := range all {
		byKey[string(kv.Key)] = kv
	}

	randKey := func() string {
		switch rng.IntN(8) {
		case 0:
			return ""
		case 1:
			return []string{"a", "b", "x", "y", "zz"}[rng.IntN(5)]
		}
		return fmt.Sprintf("c%03d", rng.IntN(320))
	}
	for iter := range 300 {
		p := ScanParams{Start: []byte(randKey()), End: []byte(randKey()), Reverse: rng.IntN(2) == 0,
			Limit: rng.IntN(12), KeysOnly: rng.IntN(3) == 0, Now: now}
		if rng.IntN(3) > 0 {
			p.MaxBytes = 1 + rng.IntN(1500)
		}
		var want []string
		for _, k := range keys {
			if k >= string(p.Start) && (len(p.End) == 0 || k < string(p.End)) {
				want = append(want, k)
			}
		}
		if p.Reverse {
			slices.Reverse(want)
		}
		lo, hi := string(p.Start), string(p.End)
		if hi != "" && lo >= hi {
			pg, err := s.Scan(p)
			kvs, more := pg.KVs, pg.More
			if err != nil || more || len(kvs) != 0 {
				t.Fatalf("empty range [%q, %q): %d keys, %v, %v", lo, hi, len(kvs), more, err)
			}
			continue
		}
		if lo >= "y" || (hi != "" && hi <= "b") {
			if _, err := s.Scan(p); !errors.Is(err, ErrKeyOutsideShard) {
				t.Fatalf("range [%q, %q) outside the shard: %v", lo, hi, err)
			}
			continue
		}
		var got []string
		for page := 0; ; page++ {
			if page > 400 {
				t.Fatal("scan does not terminate")
			}
			pg, err := s.Scan(p)
			if err != nil {
				t.Fatal(err)
			}
			kvs, resume, more := pg.KVs, pg.ResumeKey, pg.More
			if p.Limit > 0 && len(kvs) > p.Limit {
				t.Fatalf("page of %d keys over limit %d", len(kvs), p.Limit)
			}
			size := 0
			for _, kv := range kvs {
				size += len(kv.Key) + len(kv.Value)
				w := byKey[string(kv.Key)]
				if p.KeysOnly {
					if kv.Value != nil || kv.ModRevision != w.ModRevision {
						t.Fatalf("keys-only kv %v", kv)
					}
				} else if !proto.Equal(kv, w) {
					t.Fatalf("kv %v, want %v", kv, w)
				}
				got = append(got, string(kv.Key))
			}
			maxBytes := p.MaxBytes
			if maxBytes <= 0 {
				maxBytes = DefaultScanMaxBytes
			}
			if size > maxBytes && len(kvs) > 1 {
				t.Fatalf("page of %d bytes over MaxBytes %d", size, maxBytes)
			}
			if !more {
				if resume != nil {
					t.Fatalf("resume key %q without more", resume)
				}
				break
			}
			if len(kvs) == 0 {
				t.Fatal("empty page with more")
			}
			if p.Reverse {
				p.End = resume
				if !bytes.Equal(resume, kvs[len(kvs)-1].Key) {
					t.Fatalf("reverse resume %q, last key %q", resume, kvs[len(kvs)-1].Key)
				}
			} else {
				p.Start = resume
				if bytes.Compare(resume, kvs[len(kvs)-1].Key) <= 0 {
					t.Fatalf("forward resume %q not past last key %q", resume, kvs[len(kvs)-1].Key)
				}
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("iter %d: params %+v: got %d keys %q..., want %d", iter, p, len(got), got[:min(5, len(got))], len(want))
		}
	}

	// MultiGet sees one point and checks every key.
	kvs, rev, err := s.MultiGet([][]byte{[]byte("c001"), []byte("nope"), []byte("c002")}, now)
	if err != nil || len(kvs) != 3 || kvs[1] != nil || rev != s.Revision() {
		t.Fatal(kvs, rev, err)
	}
	for i, k := range []string{"c001", "c002"} {
		if got := kvs[i*2]; !proto.Equal(got, byKey[k]) && !(got == nil && byKey[k] == nil) {
			t.Fatalf("MultiGet %s = %v, want %v", k, got, byKey[k])
		}
	}
	if _, _, err := s.MultiGet([][]byte{[]byte("c001"), []byte("z")}, now); !errors.Is(err, ErrKeyOutsideShard) {
		t.Fatal(err)
	}
	if _, _, err := s.Get([]byte("a"), now); !errors.Is(err, ErrKeyOutsideShard) {
		t.Fatal(err)
	}
	if s.SizeBytes() == 0 {
		t.Fatal("SizeBytes is 0 after a flush")
	}
}

// TestApplyIOError makes every engine write fail mid-run: Apply must report
// the error, refuse later work, and after a reopen without faults (or the
// state a crash would leave) the shard must hold exactly the state after
// some whole Apply call before the failing one: nothing of the failed batch.
func TestApplyIOError(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprint("crash=", crash), func(t *testing.T) {
			for seed := range uint64(4) {
				runIOError(t, seed, crash)
			}
		})
	}
}

func runIOError(t *testing.T, seed uint64, crash bool) {
	mem := vfs.NewCrashableMem()
	tog := errorfs.NewToggle(errorfs.Filter(errorfs.WriteOps(), errorfs.FromIndex(int64(seed%3), errorfs.ErrEIO)))
	var opts []errorfs.Option
	if crash {
		opts = append(opts, errorfs.WithShortWrites(int64(seed)))
	}
	env := newTestEnv(t, errorfs.Wrap(mem, tog, opts...))
	desc := userDesc(1, "k05", "k35")
	s, err := Bootstrap("a", initialState(desc), env.opts(50))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 11))
	m := newModel(desc)
	g := &txnGen{rng: rng, m: m}
	f := newFeeder(s)
	type snap struct {
		kv  map[string]rec
		rev uint64
	}
	// history holds the model after each successful Apply call, by index.
	history := map[uint64]snap{f.index: {maps.Clone(m.kv), 0}}
	now := ts0
	applyBatch := func() ([]replication.Entry, error) {
		var entries []replication.Entry
		next := m.clone()
		for range 1 + rng.IntN(4) {
			now += 3e6
			txn := g.txn(now)
			g.m = next
			next.applyTxn(txn, now)
			entries = append(entries, f.entry(marshalCmd(t, withID(fmt.Sprint("r", f.index), txnCmd(now, txn)))))
		}
		g.m = m
		_, err := s.Apply(entries)
		if err == nil {
			*m = *next
			history[f.index] = snap{maps.Clone(m.kv), m.rev}
		}
		return entries, err
	}
	for range 30 + rng.IntN(30) {
		if _, err := applyBatch(); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(10) == 0 {
			if _, err := s.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	tog.Enable()
	var failed []replication.Entry
	for range 500 {
		entries, err := applyBatch()
		if err != nil {
			if !errorfs.IsInjected(err) {
				t.Fatalf("Apply error %v is not the injected one", err)
			}
			failed = entries
			break
		}
		if rng.IntN(4) == 0 {
			_, _ = s.Flush() // may fail too: that also stops the shard
		}
	}
	if failed == nil {
		t.Fatal("no Apply failed")
	}
	if _, err := s.Apply([]replication.Entry{f.entry(nil)}); err == nil {
		t.Fatal("Apply after a failure succeeded")
	}
	if _, err := s.Flush(); err == nil {
		t.Fatal("Flush after a failure succeeded")
	}
	_ = s.Close()
	tog.Disable()

	fs := vfs.FS(mem)
	if crash {
		fs = mem.CrashClone(vfs.WithRandomTail(rand.New(rand.NewPCG(seed, 3))))
	}
	env2 := newTestEnv(t, fs)
	r := env2.open("a", 50)
	st := r.AppliedState()
	if st.Index >= failed[0].Index {
		t.Fatalf("reopened at index %d, at or past the failed batch (%d)", st.Index, failed[0].Index)
	}
	want, ok := history[st.Index]
	if !ok {
		t.Fatalf("reopened at index %d, not the end of an Apply call", st.Index)
	}
	if got := dataDump(t, r); !maps.Equal(got, want.kv) || r.Revision() != want.rev {
		t.Fatalf("reopened state at index %d differs: rev %d want %d: %s", st.Index, r.Revision(), want.rev, diffMaps(got, want.kv))
	}
	// The shard carries on from there.
	fr := newFeeder(r)
	applyOne(t, r, fr, txnCmd(now, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k10", "after", 0, false)}}))
}
