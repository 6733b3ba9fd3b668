package server_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/wal"
)

// BenchmarkWALBytesPerPut measures what a client's put costs the
// write-ahead logs of a 3-node cluster, as shale-bench cluster's
// wal_bytes_per_op does (the growth of shale_storage_wal_bytes_total,
// batch bytes without the log's chunk headers, per put and replica), and
// where those bytes go: it reads every node's Raft log and shard engine
// WALs back and logs their records by part. Keys are 16 bytes and values
// 256, as shale-bench's. Cases: every put a new key, from 1 client and from
// 32; and keys drawn from 1,000, so that most puts overwrite (an
// overwrite's change-log item carries the value it replaced). Run with
// -benchtime Nx (N of a few thousand: the Raft log's WAL must still hold
// the run's records when it is read back) and -v (the parts are logged).
func BenchmarkWALBytesPerPut(b *testing.B) {
	for _, bc := range []struct {
		name          string
		clients, keys int // keys 0: a new key every put
	}{
		{"clients=1", 1, 0},
		{"clients=32", 32, 0},
		{"clients=32/keys=1000", 32, 1000},
	} {
		b.Run(bc.name, func(b *testing.B) { benchWALBytes(b, bc.clients, bc.keys) })
	}
}

func benchWALBytes(b *testing.B, clients, keys int) {
	c := testcluster.Start(b, testcluster.Options{TickInterval: 100 * time.Millisecond})
	c.WaitLeaders(20 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl, err := client.New(ctx, c.Endpoints(), client.WithDefaultTimeout(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	value := []byte(strings.Repeat("v", 256))
	if _, err := cl.Put(ctx, []byte("warm-up-key-0000"), value); err != nil {
		b.Fatal(err)
	}
	before := walCounters(b, c)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	b.ResetTimer()
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				k := uint64(i)
				if keys > 0 {
					k = uint64(rng.IntN(keys))
				}
				if _, err := cl.Put(ctx, fmt.Appendf(nil, "%016x", k*0x9e3779b97f4a7c15), value); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	after := walCounters(b, c)
	replicas := float64(len(c.NodeIDs()))
	per := func(kind string) float64 { return (after[kind] - before[kind]) / float64(b.N) / replicas }
	b.ReportMetric(per("raftlog"), "raftlog-B/put")
	b.ReportMetric(per("shard"), "engine-B/put")
	b.ReportMetric(per("raftlog")+per("shard"), "wal-B/put")

	if b.N < 100 {
		return // too few puts for the parts to say anything
	}
	// Where the bytes go, read back from every node's logs (the whole
	// cluster's life: the few records before the timed puts included).
	var parts walParts
	for _, id := range c.NodeIDs() {
		dir := filepath.Join(c.Dir(), fmt.Sprintf("node%d", id))
		parts.raftLog(b, filepath.Join(dir, "raftlog"))
		shards, _ := filepath.Glob(filepath.Join(dir, "shards", "*"))
		for _, s := range shards {
			parts.engine(b, s)
		}
	}
	b.Logf("%d puts, %d clients, %s; bytes per put by part (over the puts read back: a shard engine's last unflushed WAL bytes are not in its file yet):\n%s",
		b.N, clients, map[bool]string{true: "a new key each", false: fmt.Sprintf("keys drawn from %d", keys)}[keys == 0], parts.table())
}

// walCounters sums the cluster's shale_storage_wal_bytes_total by kind of
// log: "raftlog", or "shard" for every shard engine.
func walCounters(b *testing.B, c *testcluster.Cluster) map[string]float64 {
	b.Helper()
	sums := map[string]float64{}
	for _, id := range c.NodeIDs() {
		fams, err := c.Node(id).Metrics().Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != "shale_storage_wal_bytes_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "engine" {
						kind, _, _ := strings.Cut(l.GetValue(), "-")
						sums[kind] += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return sums
}

// walParts adds up WAL bytes by the part of a record they hold ("raft: "
// parts of Raft logs, "engine: " parts of shard engines), and the puts
// read back in each: Raft entries holding a Txn, shard engines' Sets of
// user keys.
type walParts struct {
	bytes                map[string]float64
	raftPuts, enginePuts int
	// raftEntries counts the Raft entries holding commands (a packed
	// entry holds several).
	raftEntries int
}

func (p *walParts) add(part string, n int) {
	if p.bytes == nil {
		p.bytes = map[string]float64{}
	}
	p.bytes[part] += float64(n)
}

// table lists the parts' bytes per put read back, and their sums.
func (p *walParts) table() string {
	var sb strings.Builder
	sums := map[string]float64{}
	for _, k := range slices.Sorted(maps.Keys(p.bytes)) {
		log, _, _ := strings.Cut(k, ":")
		puts := float64(max(p.raftPuts, 1))
		if log == "engine" {
			puts = float64(max(p.enginePuts, 1))
		}
		fmt.Fprintf(&sb, "  %-44s %7.1f\n", k, p.bytes[k]/puts)
		sums[log] += p.bytes[k] / puts
	}
	fmt.Fprintf(&sb, "  %-44s %7.1f (%d puts)\n", "raft: total", sums["raft"], p.raftPuts)
	fmt.Fprintf(&sb, "  %-44s %7.1f (%d puts)\n", "engine: total", sums["engine"], p.enginePuts)
	fmt.Fprintf(&sb, "  %-44s %7.2f (%d entries)\n", "raft: puts per entry holding commands", float64(p.raftPuts)/float64(max(p.raftEntries, 1)), p.raftEntries)
	return sb.String()
}

// eachBatch calls fn with every batch of the WAL files in dir and in its
// archive, oldest first.
func eachBatch(b *testing.B, dir string, fn func(*storage.Batch)) {
	b.Helper()
	var files []string
	for _, d := range []string{filepath.Join(dir, "archive"), dir} {
		m, _ := filepath.Glob(filepath.Join(d, "*.log"))
		files = append(files, m...)
	}
	slices.SortFunc(files, func(x, y string) int { return strings.Compare(filepath.Base(x), filepath.Base(y)) })
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			b.Fatal(err)
		}
		r := wal.NewReader(f, name)
		for {
			rec, err := r.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, wal.ErrTornTail) {
					b.Fatalf("%s: %v", name, err)
				}
				break
			}
			var batch storage.Batch
			if err := batch.SetRepr(rec); err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			fn(&batch)
		}
		f.Close()
	}
}

// framing is a batch record's kind byte and length prefixes.
func framing(kind storage.Kind, key, value []byte) int {
	n := 1 + len(binary.AppendUvarint(nil, uint64(len(key))))
	if kind != storage.KindLogData && kind != storage.KindDelete {
		n += len(binary.AppendUvarint(nil, uint64(len(value))))
	}
	return n
}

// raftLog adds up a node's Raft log WAL (replication/raftlog's keys: 'r',
// the shard ID, then 'e' + index for an entry, 'h' for the hard state, 't'
// for the truncated state).
func (p *walParts) raftLog(b *testing.B, dir string) {
	eachBatch(b, dir, func(batch *storage.Batch) {
		p.add("raft: batch header", 12)
		r := batch.Reader()
		for {
			kind, k, v, ok := r.Next()
			if !ok {
				break
			}
			p.add("raft: record framing", framing(kind, k, v))
			if kind != storage.KindSet || len(k) < 10 || k[9] != 'e' {
				p.add("raft: other records (hard state, truncation)", len(k)+len(v))
				continue
			}
			p.add("raft: entry key", len(k))
			var e raftpb.Entry
			if err := proto.Unmarshal(v, &e); err != nil {
				b.Fatal(err)
			}
			p.add("raft: entry header (term, index, type)", len(v)-len(e.GetData()))
			data := e.GetData()
			switch {
			case e.GetType() == raftpb.EntryType_EntryNormal && len(data) > 1 && data[0] == 2:
				// A packed entry (replication/packed.go): the version
				// byte, then each proposal's ID, length and payload.
				p.raftEntries++
				p.add("raft: proposal frame (version, proposal ID)", 1)
				for rest := data[1:]; len(rest) > 0; {
					_, n := binary.Uvarint(rest)
					if n <= 0 {
						b.Fatalf("packed entry %d: bad proposal ID", e.GetIndex())
					}
					size, m := binary.Uvarint(rest[n:])
					if m <= 0 || size > uint64(len(rest)-n-m) {
						b.Fatalf("packed entry %d: bad payload length", e.GetIndex())
					}
					p.add("raft: proposal frame (version, proposal ID)", n+m)
					p.command(rest[n+m : n+m+int(size)])
					rest = rest[n+m+int(size):]
				}
			case e.GetType() != raftpb.EntryType_EntryNormal || len(data) < 9:
				p.add("raft: other entries", len(data))
			default:
				p.raftEntries++
				p.add("raft: proposal frame (version, proposal ID)", 9)
				p.command(data[9:])
			}
		}
	})
}

// command adds up a RaftCommand's fields (shale.v1, raft.proto), and of a
// put, in a Txn or a put command (a compact command), its key and value
// apart from their wrapping (every op is taken for a put: the benchmark
// proposes nothing else).
func (p *walParts) command(cmd []byte) {
	names := map[protowire.Number]string{1: "request_id", 2: "timestamp_unix_nanos", 3: "epoch", 4: "first_attempt", 5: "hlc"}
	walk(cmd, func(num protowire.Number, field, body []byte) {
		switch num {
		case 6: // a put command
			p.raftPuts++
			p.add("raft: command put, wrapping", len(field)-len(body))
			p.putOp("raft: command put, ", body)
		case 10: // a Txn
			p.raftPuts++
			p.add("raft: command txn, wrapping", len(field)-len(body))
			walk(body, func(num protowire.Number, field, op []byte) { // TxnRequest.success
				p.add("raft: command txn, wrapping", len(field)-len(op))
				walk(op, func(_ protowire.Number, field, put []byte) { // RequestOp.put
					p.add("raft: command txn, wrapping", len(field)-len(put))
					p.putOp("raft: command txn, ", put)
				})
			})
		default:
			name := names[num]
			if name == "" {
				name = fmt.Sprintf("field %d", num)
			}
			p.add("raft: command "+name, len(field))
		}
	})
}

// putOp adds up a PutOp: its key, its value, and the rest as wrapping,
// each under the part named prefix and what it is.
func (p *walParts) putOp(prefix string, put []byte) {
	walk(put, func(num protowire.Number, field, body []byte) {
		switch num {
		case 1:
			p.add(prefix+"key", len(body))
			p.add(prefix+"wrapping", len(field)-len(body))
		case 2:
			p.add(prefix+"value", len(body))
			p.add(prefix+"wrapping", len(field)-len(body))
		default:
			p.add(prefix+"wrapping", len(field))
		}
	})
}

// walk calls fn with every field of a protobuf message: its number, its
// encoding (tag included) and, for a length-delimited field, its contents
// (else nil). It stops at anything malformed.
func walk(msg []byte, fn func(num protowire.Number, field, body []byte)) {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return
		}
		m := protowire.ConsumeFieldValue(num, typ, msg[n:])
		if m < 0 {
			return
		}
		var body []byte
		if typ == protowire.BytesType {
			body, _ = protowire.ConsumeBytes(msg[n:])
		}
		fn(num, msg[:n+m], body)
		msg = msg[n+m:]
	}
}

// engine adds up a shard engine's WAL (server/shard's layout:
// docs/shard-state-machine.md).
func (p *walParts) engine(b *testing.B, dir string) {
	eachBatch(b, dir, func(batch *storage.Batch) {
		p.add("engine: batch header", 12)
		r := batch.Reader()
		for {
			kind, k, v, ok := r.Next()
			if !ok {
				break
			}
			p.add("engine: record framing", framing(kind, k, v))
			switch {
			case kind == storage.KindLogData && len(k) > 0 && k[0] == 4:
				p.entryRecord(k)
			case kind == storage.KindLogData:
				p.add("engine: other change-log records", len(k))
			case kind == storage.KindSet && k[0] == 'd':
				p.enginePuts++
				p.add("engine: data key", len(k))
				p.add("engine: data value", len(v))
			case kind == storage.KindSet && (strings.HasPrefix(string(k), "mdedup-id/") || strings.HasPrefix(string(k), "m\x01")):
				p.add("engine: dedup entry", len(k)+len(v))
			case kind == storage.KindSet && string(k) == "mapplied":
				p.add("engine: applied record", len(k)+len(v))
			default:
				p.add("engine: other records", len(k)+len(v))
			}
		}
	})
}

// entryRecord adds up an entry record (the entry's mark and changes), its
// previous values apart.
func (p *walParts) entryRecord(rec []byte) {
	p.add("engine: entry record, kind and CRC", 5)
	q := rec[1 : len(rec)-4]
	for range 6 { // shard ID, index, term, revision, date
		_, n := binary.Uvarint(q)
		if n <= 0 {
			return
		}
		p.add("engine: entry record, mark", n)
		q = q[n:]
	}
	for len(q) > 0 {
		kind := q[0]
		p.add("engine: entry record, change items", 1)
		q = q[1:]
		if kind == 3 { // a revision item (a packed entry's)
			_, n := binary.Uvarint(q)
			if n <= 0 {
				return
			}
			p.add("engine: entry record, change items", n)
			q = q[n:]
			continue
		}
		if kind != 1 { // a delete names its key
			l, n := binary.Uvarint(q)
			if n <= 0 || int(l) > len(q)-n {
				return
			}
			p.add("engine: entry record, change items", n+int(l))
			q = q[n+int(l):]
		}
		l, n := binary.Uvarint(q)
		if n <= 0 || l > 0 && int(l-1) > len(q)-n {
			return
		}
		p.add("engine: entry record, change items", n)
		if l > 0 {
			p.add("engine: entry record, previous values", int(l-1))
			q = q[n+int(l-1):]
		} else {
			q = q[n:]
		}
	}
}
