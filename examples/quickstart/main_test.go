package main

import (
	"bytes"
	"context"
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
}
