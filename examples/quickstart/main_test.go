package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/internal/testcluster"
)

// TestQuickstart runs the quickstart against a 3-node in-process cluster.
func TestQuickstart(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("quickstart/item/")}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, c.Endpoints(), &out); err != nil {
		t.Fatalf("%v\noutput:\n%s", err, out.String())
	}
	for _, want := range []string{
		"get quickstart/greeting = hello\n",
		"get quickstart/missing: not found\n",
		"compare-and-swap hello -> hello, world: true\n",
		"scan quickstart/item/0 = 0\nscan quickstart/item/1 = 1\nscan quickstart/item/2 = 4\n",
		"watch saw PUT of quickstart/greeting = hello at revision",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// The watch replays the put itself, at the revision the put returned.
	var putRev, watchRev uint64
	for _, line := range strings.Split(out.String(), "\n") {
		fmt.Sscanf(line, "put quickstart/greeting at revision %d", &putRev)
		fmt.Sscanf(line, "watch saw PUT of quickstart/greeting = hello at revision %d", &watchRev)
	}
	if putRev == 0 || watchRev != putRev {
		t.Errorf("the put was at revision %d, the watch saw it at %d:\n%s", putRev, watchRev, out.String())
	}
}
