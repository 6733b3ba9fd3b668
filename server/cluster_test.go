package server_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
)

func newClient(t testing.TB, c *testcluster.Cluster, extra ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts := append([]client.Option{client.WithDefaultTimeout(10 * time.Second)}, extra...)
	if cs := c.Certs(); cs != nil {
		opts = append(opts, client.WithTLSFiles(cs.CAFile(), cs.ClientCertFile(), cs.ClientKeyFile()))
	}
	cl, err := client.New(ctx, c.Endpoints(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func TestClusterKV(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	cl := newClient(t, c)
	ctx := context.Background()
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("%c-key-%02d", 'a'+i%26, i)
		if _, err := cl.Put(ctx, []byte(k), []byte(fmt.Sprint(i))); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	kv, err := cl.Get(ctx, []byte("z-key-25"))
	if err != nil {
		t.Fatal(err)
	}
	if string(kv.Value) != "25" || kv.Version != 1 || kv.CreateRevision == 0 || kv.ModRevision != kv.CreateRevision {
		t.Fatalf("get: %+v", kv)
	}
	if _, err := cl.Get(ctx, []byte("nope")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get missing: %v", err)
	}
	var n int
	it := cl.Scan(ctx, nil, nil, client.WithPageSize(7))
	var prev string
	for it.Next() {
		k := string(it.KV().Key)
		if k <= prev {
			t.Fatalf("scan out of order: %q after %q", k, prev)
		}
		prev = k
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 50 {
		t.Fatalf("scan saw %d keys, want 50", n)
	}
	// Reverse across the split.
	n = 0
	it = cl.Scan(ctx, nil, nil, client.WithReverse(), client.WithPageSize(5))
	prev = "\xff"
	for it.Next() {
		k := string(it.KV().Key)
		if k >= prev {
			t.Fatalf("reverse scan out of order: %q after %q", k, prev)
		}
		prev = k
		n++
	}
	if err := it.Err(); err != nil || n != 50 {
		t.Fatalf("reverse scan: %d keys, %v", n, err)
	}
	ok, cur, err := cl.CompareAndSwap(ctx, []byte("a-key-00"), []byte("0"), []byte("zero"))
	if err != nil || !ok || string(cur.Value) != "0" {
		t.Fatalf("cas: %v %v %v", ok, cur, err)
	}
	ok, cur, err = cl.CompareAndSwap(ctx, []byte("a-key-00"), []byte("0"), []byte("again"))
	if err != nil || ok || string(cur.Value) != "zero" {
		t.Fatalf("failed cas: %v %v %v", ok, cur, err)
	}
}
