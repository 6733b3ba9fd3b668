// Package cluster benchmarks replicated key-value clusters running on the
// local machine: Shale's own 3-node cluster and, side by side in the same
// run, a 3-member etcd cluster. Every engine is started fresh for every
// workload, driven through the same small KV interface by the same
// closed-loop clients, and measured with the same histogram as the storage
// benchmark (package storagebench).
//
// # Engines
//
// An engine is a Factory registered under its name with Register, usually
// from an init function in the engine's own file (etcd.go for etcd). Adding
// an engine is one new file: implement Cluster and KV, and call
// Register("name", start) in init. The Shale peer (shale.go) runs
// shale-server processes; the etcd peer (etcd.go) runs etcd members.
//
// A variant is an engine run in another configuration, registered with
// RegisterVariant under "engine+what" (the Shale peer's "shale+tls" and
// "shale+tls+auth": the same cluster with TLS, and with TLS and
// authentication). A variant runs and is reported like any engine, but is
// not among EngineNames (the default engines of a run); WriteTable adds a
// section of its ratios to its base engine (variant ÷ engine).
//
// # CPU
//
// When a Cluster also has a Pids method (its server processes), every
// cell measures the CPU time (user + system, from /proc) those processes
// used during its timed phase and reports it per operation.
//
// # Clients
//
// A Cluster hands out client connections (Cluster.Client). Each connection
// knows every member of the cluster and is safe for concurrent use. For a
// cell with C concurrent clients the runner opens min(C, Config.Conns)
// connections (one per client when Conns is 0, the default) and client i
// uses connection i mod that number. Each client is one goroutine issuing
// one operation at a time (a closed loop, like YCSB threads and etcd's
// benchmark tool clients).
//
// # Keys and values
//
// Record i has the 16-byte key fmt.Sprintf("%016x", mix64(i)), where mix64
// is a bijection on uint64 (splitmix64's finalizer): keys are unique,
// printable, and spread uniformly over the key order, so the hot records of
// a zipfian distribution are scattered across the key space (YCSB's
// "scrambled zipfian") and inserted records land between existing ones.
// Values are 256 bytes (etcd's benchmark uses 8-byte keys and 256-byte
// values), random printable bytes.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
)

// KV is one client connection to a cluster. It is safe for concurrent use
// by many goroutines.
type KV interface {
	// Put writes value under key; it returns once the write is committed
	// (durable on a quorum).
	Put(ctx context.Context, key, value []byte) error
	// Get reads key with a linearizable read. The value is not retained by
	// the caller.
	Get(ctx context.Context, key []byte) (value []byte, found bool, err error)
	// Scan reads up to limit consecutive records starting at the first key
	// at or after start (linearizable, like Get) and returns how many it
	// read.
	Scan(ctx context.Context, start []byte, limit int) (int, error)
	// Close closes the connection.
	Close() error
}

// processes is implemented by clusters whose members are local processes,
// whose CPU time a cell then measures.
type processes interface {
	// Pids are the members' process IDs.
	Pids() []int
}

// Cluster is a running cluster of one engine.
type Cluster interface {
	// Name is the engine's name ("etcd", "shale").
	Name() string
	// Client opens a new client connection that knows every member of
	// the cluster. The connection is safe for concurrent use; the runner
	// shares it between clients as described in the package comment and
	// closes it after the cell.
	Client(ctx context.Context) (KV, error)
	// Stop stops every member and waits for them to exit. It does not
	// remove the data directory.
	Stop() error
}

// ClusterConfig is what a Factory gets to start a cluster.
type ClusterConfig struct {
	// Dir is an empty directory for the cluster's data and logs; the
	// runner removes it after the run unless asked to keep it.
	Dir string
	// Members is the number of members (3).
	Members int
	// Log receives progress messages (nil: none).
	Log io.Writer
}

func (c *ClusterConfig) logf(format string, args ...any) { logLine(c.Log, format, args...) }

// logLine writes one progress line to w; a nil w drops it. Every config's
// logf goes through it.
func logLine(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// Factory starts a fresh cluster and returns once it is healthy (has a
// leader and serves linearizable reads). ctx bounds the start.
type Factory func(ctx context.Context, cfg ClusterConfig) (Cluster, error)

var (
	registryMu sync.Mutex
	registry   = map[string]Factory{}
	variants   = map[string]Factory{}
)

// notBuilt are engines that are planned but not built into this binary,
// with the error given when one is asked for.
var notBuilt = map[string]string{}

// Register makes an engine available under name. It is meant to be called
// from an init function and panics if name is already registered.
func Register(name string, f Factory) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, ok := registry[name]; ok {
		panic("cluster: engine " + name + " registered twice")
	}
	registry[name] = f
}

// EngineNames lists the registered engines, Shale first, then the others
// in alphabetical order.
func EngineNames() []string {
	registryMu.Lock()
	defer registryMu.Unlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		if (names[i] == "shale") != (names[j] == "shale") {
			return names[i] == "shale"
		}
		return names[i] < names[j]
	})
	return names
}

// RegisterVariant makes a variant of an engine available under name
// ("engine+what", see the package comment): accepted by ParseEngines and
// Start like an engine, but not listed by EngineNames. It panics if name is
// taken or has no "+".
func RegisterVariant(name string, f Factory) {
	registryMu.Lock()
	defer registryMu.Unlock()
	_, isEngine := registry[name]
	_, isVariant := variants[name]
	if isEngine || isVariant || !strings.Contains(name, "+") {
		panic("cluster: variant " + name + " registered twice or named without engine+")
	}
	variants[name] = f
}

// VariantNames lists the registered variants in alphabetical order.
func VariantNames() []string {
	registryMu.Lock()
	defer registryMu.Unlock()
	names := make([]string, 0, len(variants))
	for n := range variants {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// VariantBase is the engine a variant name is a variant of ("shale" for
// "shale+tls+auth"), "" for a name that is not a variant's.
func VariantBase(name string) string {
	base, _, ok := strings.Cut(name, "+")
	if !ok {
		return ""
	}
	return base
}

func factory(name string) (Factory, error) {
	registryMu.Lock()
	f, ok := registry[name]
	if !ok {
		f, ok = variants[name]
	}
	registryMu.Unlock()
	if ok {
		return f, nil
	}
	if msg, ok := notBuilt[name]; ok {
		return nil, errors.New(msg)
	}
	return nil, fmt.Errorf("unknown engine %q (known: %s)", name, strings.Join(append(EngineNames(), VariantNames()...), ", "))
}

// ParseEngines splits and checks a comma-separated engine list. Engines
// that are planned but not built yet are an error.
func ParseEngines(list string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if _, err := factory(n); err != nil {
			return nil, err
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no engines given")
	}
	return out, nil
}

// Start starts a fresh cluster of the named engine.
func Start(ctx context.Context, name string, cfg ClusterConfig) (Cluster, error) {
	f, err := factory(name)
	if err != nil {
		return nil, err
	}
	if cfg.Members <= 0 {
		cfg.Members = 3
	}
	return f(ctx, cfg)
}
