package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
)

// MaxScanLength is the longest scan of ycsb-e; scan lengths are uniform in
// [1, MaxScanLength], as in YCSB's workload E.
const MaxScanLength = 100

// workload is one timed operation mix.
type workload struct {
	name string
	desc string
	// preload: load every record of the keyspace before the cells
	// (untimed).
	preload bool
	// op runs one operation and returns the key and value bytes it moved.
	op func(ctx context.Context, c *client) (bytes int64, err error)
}

// shared is the state of one (engine, workload) that every client sees.
type shared struct {
	keys     uint64   // preloaded records 0..keys-1
	zipf     *Zipfian // over [0, keys)
	vals     *values
	inserted atomic.Uint64 // ycsb-e inserts so far: records keys, keys+1, ...
}

// client is one closed-loop client: a goroutine issuing one operation at a
// time over its (possibly shared) connection.
type client struct {
	kv  KV
	r   *rand.Rand
	sh  *shared
	key []byte
}

func (c *client) keyOf(i uint64) []byte {
	c.key = AppendKey(c.key[:0], i)
	return c.key
}

func (c *client) put(ctx context.Context, i uint64) (int64, error) {
	v := c.sh.vals.pick(c.r)
	k := c.keyOf(i)
	if err := c.kv.Put(ctx, k, v); err != nil {
		return 0, err
	}
	return int64(len(k) + len(v)), nil
}

// read gets a preloaded record, which must be there.
func (c *client) read(ctx context.Context, i uint64) (int64, error) {
	k := c.keyOf(i)
	v, found, err := c.kv.Get(ctx, k)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("get %s (record %d): not found", k, i)
	}
	return int64(len(k) + len(v)), nil
}

// scan reads 1..MaxScanLength records from a preloaded record on.
func (c *client) scan(ctx context.Context, i uint64) (int64, error) {
	limit := 1 + c.r.IntN(MaxScanLength)
	k := c.keyOf(i)
	n, err := c.kv.Scan(ctx, k, limit)
	if err != nil {
		return 0, err
	}
	if n < 1 || n > limit {
		return 0, fmt.Errorf("scan from %s (record %d), limit %d: read %d records", k, i, limit, n)
	}
	return int64(n) * int64(KeySize+c.sh.vals.size), nil
}

var workloads = []workload{
	{
		name: "put",
		desc: "Put of uniformly random keys from the keyspace (empty at the start)",
		op: func(ctx context.Context, c *client) (int64, error) {
			return c.put(ctx, c.r.Uint64N(c.sh.keys))
		},
	},
	{
		name:    "get",
		desc:    "linearizable Get of uniformly random preloaded keys",
		preload: true,
		op: func(ctx context.Context, c *client) (int64, error) {
			return c.read(ctx, c.r.Uint64N(c.sh.keys))
		},
	},
	{
		name:    "ycsb-a",
		desc:    "YCSB A: 50% Get, 50% Put (update) of zipfian preloaded keys",
		preload: true,
		op: func(ctx context.Context, c *client) (int64, error) {
			i := c.sh.zipf.Next(c.r)
			if c.r.Float64() < 0.5 {
				return c.read(ctx, i)
			}
			return c.put(ctx, i)
		},
	},
	{
		name:    "ycsb-b",
		desc:    "YCSB B: 95% Get, 5% Put (update) of zipfian preloaded keys",
		preload: true,
		op: func(ctx context.Context, c *client) (int64, error) {
			i := c.sh.zipf.Next(c.r)
			if c.r.Float64() < 0.95 {
				return c.read(ctx, i)
			}
			return c.put(ctx, i)
		},
	},
	{
		name:    "ycsb-e",
		desc:    "YCSB E: 95% Scan of 1-100 records from a zipfian preloaded key, 5% Put of a new key",
		preload: true,
		op: func(ctx context.Context, c *client) (int64, error) {
			if c.r.Float64() < 0.95 {
				return c.scan(ctx, c.sh.zipf.Next(c.r))
			}
			return c.put(ctx, c.sh.keys+c.sh.inserted.Add(1)-1)
		},
	},
}

func findWorkload(name string) (*workload, bool) {
	for i := range workloads {
		if workloads[i].name == name {
			return &workloads[i], true
		}
	}
	return nil, false
}

// WorkloadNames lists the workloads in their default order.
func WorkloadNames() []string {
	out := make([]string, len(workloads))
	for i, w := range workloads {
		out[i] = w.name
	}
	return out
}

// WorkloadHelp describes every workload, one per line.
func WorkloadHelp() string {
	var b strings.Builder
	for _, w := range workloads {
		fmt.Fprintf(&b, "  %-7s %s\n", w.name, w.desc)
	}
	return b.String()
}

// ParseWorkloads splits and checks a comma-separated workload list.
func ParseWorkloads(list string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if _, ok := findWorkload(n); !ok {
			return nil, fmt.Errorf("unknown workload %q (known: %s)", n, strings.Join(WorkloadNames(), ", "))
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no workloads given")
	}
	return out, nil
}
