package shard

import (
	"fmt"
	"sync"
	"testing"
)

// TestRecordCache: what is put is got back in its namespace only, a put
// replaces, the bytes held stay within the capacity while entries are
// evicted, and the entries used since the hand last passed outlive the
// others.
func TestRecordCache(t *testing.T) {
	c := NewRecordCache(16 * 4 << 10) // 4 KiB per part
	var buf []byte
	key := func(ns uint64, k string) []byte { buf = recordKey(buf, ns, dataKey([]byte(k))); return buf }
	ns1, ns2 := c.namespace(), c.namespace()
	if ns1 == ns2 {
		t.Fatal("two namespaces alike")
	}
	c.put(key(ns1, "a"), []byte("rec-a"), true)
	c.put(key(ns1, "gone"), nil, false)
	if raw, present, ok := c.get(key(ns1, "a")); !ok || !present || string(raw) != "rec-a" {
		t.Fatalf("get a: %q %v %v", raw, present, ok)
	}
	if raw, present, ok := c.get(key(ns1, "gone")); !ok || present || raw != nil {
		t.Fatalf("get an absent key: %q %v %v", raw, present, ok)
	}
	if _, _, ok := c.get(key(ns2, "a")); ok {
		t.Fatal("another namespace sees the entry")
	}
	if m := c.Metrics(); m.Hits != 2 || m.Misses != 1 || m.Bytes <= 0 {
		t.Fatalf("metrics after 2 hits and a miss: %+v", m)
	}
	c.put(key(ns1, "a"), []byte("rec-a2"), true)
	if raw, _, _ := c.get(key(ns1, "a")); string(raw) != "rec-a2" {
		t.Fatalf("after a replacing put: %q", raw)
	}
	// A record larger than a part is not cached, and drops the old one.
	c.put(key(ns1, "a"), make([]byte, 8<<10), true)
	if _, _, ok := c.get(key(ns1, "a")); ok {
		t.Fatal("a record larger than a part was cached")
	}

	// Fill far past the capacity, keeping one key in use.
	c.put(key(ns1, "hot"), []byte("hot"), true)
	for i := range 5000 {
		c.put(key(ns1, fmt.Sprintf("k%05d", i)), make([]byte, 100), true)
		if _, _, ok := c.get(key(ns1, "hot")); !ok {
			t.Fatalf("the key in use was evicted after %d puts", i)
		}
		if used := c.UsedBytes(); used > 16*4<<10 {
			t.Fatalf("%d bytes held, capacity %d", used, 16*4<<10)
		}
	}
	if _, _, ok := c.get(key(ns1, "k00000")); ok {
		t.Fatal("the oldest unused entry survived 5000 puts")
	}
	if _, _, ok := c.get(key(ns1, "k04999")); !ok {
		t.Fatal("the newest entry is gone")
	}
	if NewRecordCache(0) != nil {
		t.Fatal("a zero capacity made a cache")
	}
	var none *RecordCache
	if none.namespace() != 0 || none.UsedBytes() != 0 || none.Metrics() != (RecordCacheMetrics{}) {
		t.Fatal("a nil cache")
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
				buf = recordKey(buf, ns, dataKey([]byte(fmt.Sprintf("k%d", i%300))))
				val := []byte(fmt.Sprintf("%d/%d", w, i))
				c.put(buf, val, true)
				if raw, _, ok := c.get(buf); ok && string(raw) != string(val) {
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
