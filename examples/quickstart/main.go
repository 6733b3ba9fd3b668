// Command quickstart is the smallest complete Go program on Shale's SDK: it
// connects to a cluster (by default the one `make run` starts), writes,
// reads, compares-and-swaps and scans a few keys, and watches one change.
// It is its own Go module, depending on the SDK the way an application
// does (see go.mod and docs/client.md, "Depending on the SDK").
//
//	go run . -endpoints 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/shale-db/shale/client"
)

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003", "comma-separated host:port addresses of cluster nodes")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, strings.Split(*endpoints, ","), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// run does the quickstart's calls against the cluster at endpoints and
// prints what each returned.
func run(ctx context.Context, endpoints []string, out io.Writer) error {
	c, err := client.New(ctx, endpoints)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer c.Close()

	put, err := c.Put(ctx, []byte("quickstart/greeting"), []byte("hello"))
	if err != nil {
		return fmt.Errorf("put: %w", err)
	}
	fmt.Fprintf(out, "put quickstart/greeting at revision %d\n", put.Revision)

	kv, err := c.Get(ctx, []byte("quickstart/greeting"))
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	fmt.Fprintf(out, "get quickstart/greeting = %s\n", kv.Value)

	if _, err := c.Get(ctx, []byte("quickstart/missing")); !errors.Is(err, client.ErrNotFound) {
		return fmt.Errorf("get of a missing key: %v, want ErrNotFound", err)
	}
	fmt.Fprintln(out, "get quickstart/missing: not found")

	ok, cur, err := c.CompareAndSwap(ctx, []byte("quickstart/greeting"), []byte("hello"), []byte("hello, world"))
	if err != nil {
		return fmt.Errorf("compare-and-swap: %w", err)
	}
	fmt.Fprintf(out, "compare-and-swap hello -> hello, world: %v\n", ok)
	if !ok {
		fmt.Fprintf(out, "  (the value was %q)\n", cur.Value)
	}

	for i := range 3 {
		if _, err := c.Put(ctx, []byte(fmt.Sprintf("quickstart/item/%d", i)), []byte(fmt.Sprint(i*i))); err != nil {
			return fmt.Errorf("put item %d: %w", i, err)
		}
	}
	it := c.Scan(ctx, nil, nil, client.WithPrefix([]byte("quickstart/item/")))
	defer it.Close()
	for it.Next() {
		fmt.Fprintf(out, "scan %s = %s\n", it.KV().Key, it.KV().Value)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("scan: %w", err)
	}

	// Watch the greeting from the revision of its first put: the watch
	// replays that put and the compare-and-swap, then follows new changes.
	// (A watch without a start revision sees changes after the revision the
	// shard is at when its stream reaches the shard, which can be after
	// Watch returns: a write made right after Watch might not be seen.)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	greeting := []byte("quickstart/greeting")
	events := c.Watch(wctx, greeting, append(greeting, 0), client.WithStartRevision(put.Revision))
	for resp := range events {
		if resp.Err != nil {
			return fmt.Errorf("watch: %w", resp.Err)
		}
		for _, ev := range resp.Events {
			if string(ev.KV.Key) == "quickstart/greeting" {
				fmt.Fprintf(out, "watch saw %s of quickstart/greeting = %s at revision %d\n", ev.Type, ev.KV.Value, ev.KV.ModRevision)
				return nil
			}
		}
	}
	return fmt.Errorf("watch ended before the write arrived: %w", ctx.Err())
}
