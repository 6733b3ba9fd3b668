package shard

import (
	"fmt"
	"sync"
	"testing"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// TestRecordCache: what is put is got back in its namespace only, a put
// replaces, the bytes held stay within the capacity while entries are
// evicted, and the entries used since the hand last passed outlive the
// others.
func TestRecordCache(t *testing.T) {
	c := NewRecordCache(16 * 4 << 10) // 4 KiB per part
	var buf []byte
	key := func(sp *recordSpace, k string) []byte { buf = recordKey(buf, sp.id, dataKey([]byte(k))); return buf }
	ns1, ns2 := c.namespace(), c.namespace()
	if ns1.id == ns2.id {
		t.Fatal("two namespaces alike")
	}
	c.put(key(ns1, "a"), []byte("rec-a"), true, ns1)
	c.put(key(ns1, "gone"), nil, false, ns1)
	if raw, present, ok := c.get(key(ns1, "a"), ns1); !ok || !present || string(raw) != "rec-a" {
		t.Fatalf("get a: %q %v %v", raw, present, ok)
	}
	if raw, present, ok := c.get(key(ns1, "gone"), ns1); !ok || present || raw != nil {
		t.Fatalf("get an absent key: %q %v %v", raw, present, ok)
	}
	if _, _, ok := c.get(key(ns2, "a"), ns2); ok {
		t.Fatal("another namespace sees the entry")
	}
	if m := c.Metrics(); m.Hits != 2 || m.Misses != 1 || m.Bytes <= 0 {
		t.Fatalf("metrics after 2 hits and a miss: %+v", m)
	}
	c.put(key(ns1, "a"), []byte("rec-a2"), true, ns1)
	if raw, _, _ := c.get(key(ns1, "a"), ns1); string(raw) != "rec-a2" {
		t.Fatalf("after a replacing put: %q", raw)
	}
	// A record larger than a part is not cached, and drops the old one.
	c.put(key(ns1, "a"), make([]byte, 8<<10), true, ns1)
	if _, _, ok := c.get(key(ns1, "a"), ns1); ok {
		t.Fatal("a record larger than a part was cached")
	}

	// Fill far past the capacity, keeping one key in use.
	c.put(key(ns1, "hot"), []byte("hot"), true, ns1)
	for i := range 5000 {
		c.put(key(ns1, fmt.Sprintf("k%05d", i)), make([]byte, 100), true, ns1)
		if _, _, ok := c.get(key(ns1, "hot"), ns1); !ok {
			t.Fatalf("the key in use was evicted after %d puts", i)
		}
		if used := c.UsedBytes(); used > 16*4<<10 {
			t.Fatalf("%d bytes held, capacity %d", used, 16*4<<10)
		}
	}
	if _, _, ok := c.get(key(ns1, "k00000"), ns1); ok {
		t.Fatal("the oldest unused entry survived 5000 puts")
	}
	if _, _, ok := c.get(key(ns1, "k04999"), ns1); !ok {
		t.Fatal("the newest entry is gone")
	}
	if NewRecordCache(0) != nil {
		t.Fatal("a zero capacity made a cache")
	}
	var none *RecordCache
	if none.namespace() != nil || none.UsedBytes() != 0 || none.Metrics() != (RecordCacheMetrics{}) {
		t.Fatal("a nil cache")
	}
}

// TestRecordCacheComplete: a complete space answers "absent" for a key it
// holds nothing of, until the cache evicts one of its entries or refuses
// one of its records; an incomplete space, or another, does not know.
func TestRecordCacheComplete(t *testing.T) {
	c := NewRecordCache(16 * 4 << 10) // 4 KiB per part
	var buf []byte
	key := func(sp *recordSpace, k string) []byte { buf = recordKey(buf, sp.id, dataKey([]byte(k))); return buf }
	ns1, ns2 := c.namespace(), c.namespace()
	if ns1.complete.Load() {
		t.Fatal("a new namespace is complete")
	}
	ns1.complete.Store(true)
	c.put(key(ns1, "a"), []byte("rec-a"), true, ns1)
	if raw, present, ok := c.get(key(ns1, "a"), ns1); !ok || !present || string(raw) != "rec-a" {
		t.Fatalf("get a: %q %v %v", raw, present, ok)
	}
	if raw, present, ok := c.get(key(ns1, "b"), ns1); !ok || present || raw != nil {
		t.Fatalf("get a key a complete space holds nothing of: %q %v %v", raw, present, ok)
	}
	if _, _, ok := c.get(key(ns2, "b"), ns2); ok {
		t.Fatal("an incomplete space knows a key it holds nothing of")
	}
	// A refused record (larger than a part) ends completeness.
	c.put(key(ns1, "a"), make([]byte, 8<<10), true, ns1)
	if ns1.complete.Load() {
		t.Fatal("complete after a refused record")
	}
	if _, _, ok := c.get(key(ns1, "a"), ns1); ok {
		t.Fatal("the refused record's key is known")
	}
	// So does an eviction, of any space's entry in the part.
	ns2.complete.Store(true)
	for i := 0; ns2.complete.Load(); i++ {
		if i == 5000 {
			t.Fatal("complete after 5000 puts into 64 KiB")
		}
		c.put(key(ns2, fmt.Sprintf("k%05d", i)), make([]byte, 100), true, ns2)
	}
	if _, _, ok := c.get(key(ns2, "absent"), ns2); ok {
		t.Fatal("an incomplete space knows a key it holds nothing of")
	}
}

// TestRecordCacheConcurrent: shards' apply workers use one cache at once
// (run under -race).
func TestRecordCacheConcurrent(t *testing.T) {
	c := NewRecordCache(64 << 10)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ns := c.namespace()
			var buf []byte
			for i := range 2000 {
				buf = recordKey(buf, ns.id, dataKey([]byte(fmt.Sprintf("k%d", i%300))))
				val := []byte(fmt.Sprintf("%d/%d", w, i))
				c.put(buf, val, true, ns)
				if raw, _, ok := c.get(buf, ns); ok && string(raw) != string(val) {
					t.Errorf("worker %d read %q, want %q (its own namespace)", w, raw, val)
					return
				}
			}
		}()
	}
	wg.Wait()
	if used := c.UsedBytes(); used > 64<<10 {
		t.Fatalf("%d bytes held, capacity %d", used, 64<<10)
	}
}

// TestRecordCacheKnowsAbsentKeys: the applies of a bootstrapped shard read
// no engine for keys it never wrote, and get the right revisions; the same
// shard reopened does not know its keys whole, and reads the engine for a
// new key.
func TestRecordCacheKnowsAbsentKeys(t *testing.T) {
	env := newTestEnv(t, nil)
	env.records = NewRecordCache(64 << 20)
	s := env.bootstrap("shard", userDesc(2, "", ""), 100)
	f := newFeeder(s)
	put := func(k string) *shalev1.CommandResult {
		t.Helper()
		res, err := results(s.Apply([]replication.Entry{f.entry(marshalCmd(t, txnCmd(1, &shalev1.TxnRequest{
			Success: []*shalev1.RequestOp{putOp(k, "v-"+k, 0, true)}})))}))
		if err != nil {
			t.Fatal(err)
		}
		return res[0].(*shalev1.CommandResult)
	}
	for i := range 20 {
		if res := put(fmt.Sprintf("k%02d", i%10)); (i < 10) != (res.GetTxn().GetResults()[0].GetPut().GetPrevKv() == nil) {
			t.Fatalf("put %d: prev_kv %v", i, res.GetTxn().GetResults()[0].GetPut().GetPrevKv())
		}
	}
	if m := env.records.Metrics(); m.Misses != 0 || m.Hits != 20 {
		t.Fatalf("after 10 new keys and 10 overwrites: %+v, want 20 hits and no miss", m)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = env.open("shard", 100)
	f = newFeeder(s)
	if kv := put("k00").GetTxn().GetResults()[0].GetPut().GetPrevKv(); kv == nil || kv.GetVersion() != 2 {
		t.Fatalf("overwrite after reopen: prev_kv %v, want version 2", kv)
	}
	if m := env.records.Metrics(); m.Misses != 1 {
		t.Fatalf("after reopen: %+v, want a miss (read from the engine)", m)
	}
}
