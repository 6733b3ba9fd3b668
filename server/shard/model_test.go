package shard

// A model-based randomized test of Txn apply: random transactions (compares
// of every target and operator, puts with and without TTLs, deletes,
// delete-ranges, gets, out-of-range keys, malformed and empty entries) are
// applied both to a Shard and to a simple in-memory oracle; results, the
// revision and every stored record (expired ones included) must agree, also
// across Close/Open in the middle and across engine flushes.

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// model is the oracle: the stored records of the shard and its revision.
type model struct {
	kv    map[string]rec
	rev   uint64
	desc  *shalev1.ShardDescriptor
	start string
	end   string // "" = unbounded
	// events collects the changes of applied transactions, as the change
	// log must record them.
	events []Event
}

func newModel(desc *shalev1.ShardDescriptor) *model {
	return &model{kv: map[string]rec{}, desc: desc, start: string(desc.StartKey), end: string(desc.EndKey)}
}

func (m *model) clone() *model {
	c := *m
	c.kv = maps.Clone(m.kv)
	return &c
}

func (m *model) inRange(k string) bool { return k >= m.start && (m.end == "" || k < m.end) }

func (m *model) live(k string, now int64) (rec, bool) {
	r, ok := m.kv[k]
	if !ok || (r.expire != 0 && r.expire <= now) {
		return rec{}, false
	}
	return r, true
}

func (m *model) kvOf(k string, r rec) *shalev1.KeyValue {
	kv := &shalev1.KeyValue{Key: []byte(k), CreateRevision: r.create, ModRevision: r.mod, Version: r.version, ExpireUnixNanos: r.expire}
	if r.value != "" {
		kv.Value = []byte(r.value)
	}
	return kv
}

// clip returns the range a delete range deletes (an open end runs to the
// shard's end), or the code of its rejection: InvalidArgument for an empty
// start or an empty or inverted range, OutOfRange for a range reaching
// outside the shard.
func (m *model) clip(op *shalev1.DeleteRangeOp) (lo, hi string, code codes.Code) {
	lo, hi = string(op.StartKey), string(op.EndKey)
	if lo == "" || (hi != "" && lo >= hi) {
		return "", "", codes.InvalidArgument
	}
	if !m.inRange(lo) || (hi != "" && m.end != "" && hi > m.end) {
		return "", "", codes.OutOfRange
	}
	if hi == "" {
		hi = m.end
	}
	return lo, hi, codes.OK
}

// applyTxn applies txn to the model and returns the expected result; for a
// rejected txn only the error code is meaningful. A malformed txn
// (InvalidArgument) is refused before one with a key outside the shard
// (OutOfRange).
func (m *model) applyTxn(txn *shalev1.TxnRequest, now int64) *shalev1.CommandResult {
	reject := func(c codes.Code) *shalev1.CommandResult { return &shalev1.CommandResult{ErrorCode: uint32(c)} }
	if len(txn.Compares)+len(txn.Success)+len(txn.Failure) == 0 {
		return reject(codes.InvalidArgument)
	}
	outside := false
	for _, c := range txn.Compares {
		outside = outside || !m.inRange(string(c.Key))
	}
	for _, ops := range [][]*shalev1.RequestOp{txn.Success, txn.Failure} {
		for _, op := range ops {
			switch o := op.Op.(type) {
			case *shalev1.RequestOp_Put:
				outside = outside || !m.inRange(string(o.Put.Key))
			case *shalev1.RequestOp_Delete:
				outside = outside || !m.inRange(string(o.Delete.Key))
			case *shalev1.RequestOp_Get:
				outside = outside || !m.inRange(string(o.Get.Key))
			case *shalev1.RequestOp_DeleteRange:
				switch _, _, code := m.clip(o.DeleteRange); code {
				case codes.InvalidArgument:
					return reject(code)
				case codes.OutOfRange:
					outside = true
				}
			}
		}
	}
	if outside {
		return reject(codes.OutOfRange)
	}
	ok := true
	for _, c := range txn.Compares {
		r, present := m.live(string(c.Key), now)
		var cmpRes int
		switch c.Target {
		case shalev1.Compare_TARGET_VALUE_UNSPECIFIED:
			if !present {
				ok = false
			}
			cmpRes = bytes.Compare([]byte(r.value), c.Value)
		default:
			var n uint64
			switch c.Target {
			case shalev1.Compare_TARGET_VERSION:
				n = r.version
			case shalev1.Compare_TARGET_CREATE_REVISION:
				n = r.create
			case shalev1.Compare_TARGET_MOD_REVISION:
				n = r.mod
			case shalev1.Compare_TARGET_EXISTS:
				if present {
					n = 1
				}
			}
			switch {
			case n < c.Number:
				cmpRes = -1
			case n > c.Number:
				cmpRes = 1
			}
		}
		if !ok {
			break
		}
		switch c.Result {
		case shalev1.Compare_RESULT_EQUAL_UNSPECIFIED:
			ok = cmpRes == 0
		case shalev1.Compare_RESULT_NOT_EQUAL:
			ok = cmpRes != 0
		case shalev1.Compare_RESULT_GREATER:
			ok = cmpRes > 0
		case shalev1.Compare_RESULT_LESS:
			ok = cmpRes < 0
		}
		if !ok {
			break
		}
	}
	ops := txn.Success
	if !ok {
		ops = txn.Failure
	}
	rev := m.rev
	for _, op := range ops {
		if _, isGet := op.Op.(*shalev1.RequestOp_Get); !isGet {
			rev = m.rev + 1
		}
	}
	m.rev = rev
	resp := &shalev1.TxnResponse{
		Header:    &shalev1.ResponseHeader{ShardId: m.desc.ShardId, Revision: rev, Epoch: m.desc.Epoch},
		Succeeded: ok,
		Results:   []*shalev1.ResponseOp{},
	}
	for _, op := range ops {
		switch o := op.Op.(type) {
		case *shalev1.RequestOp_Put:
			k := string(o.Put.Key)
			nr := rec{create: rev, mod: rev, version: 1, value: string(o.Put.Value)}
			if o.Put.TtlMs > 0 {
				nr.expire = now + o.Put.TtlMs*1e6
			}
			pr := &shalev1.PutResponse{}
			if old, present := m.live(k, now); present {
				nr.create, nr.version = old.create, old.version+1
				if o.Put.PrevKv {
					pr.PrevKv = m.kvOf(k, old)
				}
			}
			ev := Event{Kind: EventPut, KV: m.kvOf(k, nr)}
			if old, present := m.live(k, now); present {
				ev.Prev = m.kvOf(k, old)
			}
			m.events = append(m.events, ev)
			m.kv[k] = nr
			resp.Results = append(resp.Results, &shalev1.ResponseOp{Op: &shalev1.ResponseOp_Put{Put: pr}})
		case *shalev1.RequestOp_Delete:
			k := string(o.Delete.Key)
			dr := &shalev1.DeleteResponse{}
			if old, present := m.live(k, now); present {
				dr.Deleted = 1
				if o.Delete.PrevKv {
					dr.PrevKv = m.kvOf(k, old)
				}
				m.events = append(m.events, Event{Kind: EventDelete, KV: &shalev1.KeyValue{Key: []byte(k), ModRevision: rev}, Prev: m.kvOf(k, old)})
			}
			delete(m.kv, k)
			resp.Results = append(resp.Results, &shalev1.ResponseOp{Op: &shalev1.ResponseOp_Delete{Delete: dr}})
		case *shalev1.RequestOp_DeleteRange:
			lo, hi, _ := m.clip(o.DeleteRange)
			for _, k := range slices.Sorted(maps.Keys(m.kv)) {
				if k >= lo && (hi == "" || k < hi) {
					if old, present := m.live(k, now); present {
						m.events = append(m.events, Event{Kind: EventDelete, KV: &shalev1.KeyValue{Key: []byte(k), ModRevision: rev}, Prev: m.kvOf(k, old)})
					}
					delete(m.kv, k)
				}
			}
			resp.Results = append(resp.Results, &shalev1.ResponseOp{Op: &shalev1.ResponseOp_DeleteRange{DeleteRange: &shalev1.DeleteRangeResponse{}}})
		case *shalev1.RequestOp_Get:
			gr := &shalev1.GetResponse{}
			if r, present := m.live(string(o.Get.Key), now); present {
				gr.Kv = m.kvOf(string(o.Get.Key), r)
			}
			resp.Results = append(resp.Results, &shalev1.ResponseOp{Op: &shalev1.ResponseOp_Get{Get: gr}})
		}
	}
	return &shalev1.CommandResult{Txn: resp}
}

// txnGen generates random transactions.
type txnGen struct {
	rng *rand.Rand
	m   *model
}

func (g *txnGen) key() string {
	if g.rng.IntN(25) == 0 { // occasionally outside the shard [k05, k35)
		return fmt.Sprintf("k%02d", []int{0, 3, 36, 39}[g.rng.IntN(4)])
	}
	return fmt.Sprintf("k%02d", 5+g.rng.IntN(30))
}

func (g *txnGen) value() string {
	if g.rng.IntN(10) == 0 {
		return ""
	}
	return fmt.Sprintf("v%d", g.rng.IntN(6))
}

func (g *txnGen) compare(now int64) *shalev1.Compare {
	k := g.key()
	c := &shalev1.Compare{
		Key:    []byte(k),
		Target: shalev1.Compare_Target(g.rng.IntN(5)),
		Result: shalev1.Compare_Result(g.rng.IntN(4)),
	}
	r := g.m.kv[k]
	switch c.Target {
	case shalev1.Compare_TARGET_VALUE_UNSPECIFIED:
		c.Value = []byte(g.value())
		if g.rng.IntN(2) == 0 {
			c.Value = []byte(r.value)
		}
	case shalev1.Compare_TARGET_EXISTS:
		c.Number = uint64(g.rng.IntN(2))
	default:
		cands := []uint64{0, 1, 2, r.version, r.create, r.mod, g.m.rev}
		c.Number = cands[g.rng.IntN(len(cands))]
	}
	return c
}

func (g *txnGen) op() *shalev1.RequestOp {
	switch n := g.rng.IntN(20); {
	case n < 9:
		var ttl int64
		if g.rng.IntN(3) == 0 {
			ttl = 1 + g.rng.Int64N(60)
		}
		return putOp(g.key(), g.value(), ttl, g.rng.IntN(2) == 0)
	case n < 13:
		return delOp(g.key(), g.rng.IntN(2) == 0)
	case n < 15:
		a, b := g.key(), g.key()
		if a > b {
			a, b = b, a
		}
		switch g.rng.IntN(6) {
		case 0:
			b = ""
		case 1:
			a = ""
		case 2:
			b = a // rejected: empty range
		}
		return delRangeOp(a, b)
	default:
		return getOp(g.key())
	}
}

func (g *txnGen) txn(now int64) *shalev1.TxnRequest {
	t := &shalev1.TxnRequest{}
	for range g.rng.IntN(3) {
		t.Compares = append(t.Compares, g.compare(now))
	}
	for range g.rng.IntN(5) {
		t.Success = append(t.Success, g.op())
	}
	for range g.rng.IntN(3) {
		t.Failure = append(t.Failure, g.op())
	}
	return t
}

func TestModelTxn(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runModel(t, seed, 400, 32<<10, false) })
	}
	// A record cache that holds every record, and none.
	t.Run("large-cache", func(t *testing.T) { runModel(t, 3, 400, 64<<20, false) })
	t.Run("no-cache", func(t *testing.T) { runModel(t, 4, 400, 0, false) })
	// The same steps with each step's commands packed into one Raft entry
	// give the same results, records, revisions and events.
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("packed-seed", seed), func(t *testing.T) { runModel(t, seed, 400, 32<<10, true) })
	}
}

// runModel runs steps random steps with a record cache of recordCache bytes
// (0: none). With packed, each step's commands are the parts of one packed
// Raft entry (replication.Entry.Parts) instead of an entry each.
func runModel(t *testing.T, seed uint64, steps int, recordCache int64, packed bool) {
	rng := rand.New(rand.NewPCG(seed, 77))
	env := newTestEnv(t, nil)
	env.keepWAL = true
	env.records = NewRecordCache(recordCache)
	desc := userDesc(7, "k05", "k35")
	s := env.bootstrap("shard", desc, 0)
	f := newFeeder(s)
	m := newModel(desc)
	g := &txnGen{rng: rng, m: m}
	now := int64(1_700_000_000_000_000_000)
	wantEvents := map[uint64][]Event{} // by entry index

	for step := range steps {
		n := 1 + rng.IntN(4)
		if packed {
			n++ // at least two parts
		}
		var entries []replication.Entry
		var want []*shalev1.CommandResult // nil for entries without a result
		for range n {
			now += rng.Int64N(20e6) - 2e6 // mostly forward, sometimes back
			switch k := rng.IntN(20); {
			case k == 0:
				entries = append(entries, f.entry(nil))
				want = append(want, nil)
			case k == 1:
				entries = append(entries, f.entry(marshalCmd(t, &shalev1.RaftCommand{Command: &shalev1.RaftCommand_Noop{Noop: true}})))
				want = append(want, nil)
			case k == 2:
				entries = append(entries, f.entry([]byte{0xff, 0xff, 0xff}))
				want = append(want, &shalev1.CommandResult{ErrorCode: uint32(codes.InvalidArgument)})
			default:
				txn := g.txn(now)
				entries = append(entries, f.entry(marshalCmd(t, txnCmd(now, txn))))
				m.events = nil
				want = append(want, m.applyTxn(txn, now))
				wantEvents[f.index] = m.events
			}
		}
		if packed {
			// One entry, at the first part's index.
			idx := entries[0].Index
			var evs []Event
			for i := range entries {
				entries[i].Index, entries[i].Part, entries[i].Parts = idx, i, n
				evs = append(evs, wantEvents[idx+uint64(i)]...)
				delete(wantEvents, idx+uint64(i))
			}
			wantEvents[idx] = evs
			f.index = idx
		}
		res, err := results(s.Apply(entries))
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for i, w := range want {
			got, _ := res[i].(*shalev1.CommandResult)
			switch {
			case w == nil:
				if res[i] != nil {
					t.Fatalf("step %d entry %d: result %v, want none", step, i, res[i])
				}
			case w.ErrorCode != 0:
				if got == nil || got.ErrorCode != w.ErrorCode || got.Txn != nil {
					t.Fatalf("step %d entry %d: result %v, want error code %d", step, i, got, w.ErrorCode)
				}
			default:
				if got == nil || !proto.Equal(got, w) {
					t.Fatalf("step %d entry %d: result\n%v\nwant\n%v", step, i, got, w)
				}
			}
		}
		if s.Revision() != m.rev {
			t.Fatalf("step %d: revision %d, want %d", step, s.Revision(), m.rev)
		}
		if st := s.AppliedState(); st.Index != f.index {
			t.Fatalf("step %d: applied index %d, want %d", step, st.Index, f.index)
		}
		checkReads(t, s, m, rng, now)
		if step%25 == 0 {
			if got := dataDump(t, s); !maps.Equal(got, m.kv) {
				t.Fatalf("step %d: stored records differ: %s", step, diffMaps(got, m.kv))
			}
		}
		switch rng.IntN(60) {
		case 0: // reopen in the middle
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = env.open("shard", 0)
			st := s.AppliedState()
			if st.Index != f.index || st.Term != f.term || s.Revision() != m.rev || !proto.Equal(st.Descriptor, desc) {
				t.Fatalf("step %d: after reopen applied (%d, %d) rev %d desc %v; want (%d, %d) rev %d",
					step, st.Index, st.Term, s.Revision(), st.Descriptor, f.index, f.term, m.rev)
			}
			if got := dataDump(t, s); !maps.Equal(got, m.kv) {
				t.Fatalf("step %d: stored records differ after reopen: %s", step, diffMaps(got, m.kv))
			}
		case 1:
			idx, err := s.Flush()
			if err != nil || idx != f.index {
				t.Fatalf("flush: %d, %v; want %d", idx, err, f.index)
			}
		}
	}
	if got := dataDump(t, s); !maps.Equal(got, m.kv) {
		t.Fatalf("stored records differ: %s", diffMaps(got, m.kv))
	}
	checkChangeLog(t, s, f.index, wantEvents)
}

// checkChangeLog decodes the entries left in the shard's WAL and compares
// their events with the model's, entry by entry: every entry from the
// first one still in the WAL through last must be there, once, in order.
func checkChangeLog(t *testing.T, s *Shard, last uint64, want map[uint64][]Event) {
	t.Helper()
	entries := walEntries(t, s)
	if len(entries) == 0 {
		t.Fatal("no entries in the WAL")
	}
	first := entries[0].Mark.Index
	for i, e := range entries {
		if e.Mark.Index != first+uint64(i) {
			t.Fatalf("entry %d follows entry %d", e.Mark.Index, first+uint64(i)-1)
		}
		w := want[e.Mark.Index]
		if len(e.Events) != len(w) {
			t.Fatalf("entry %d: %d events %v, want %d %v", e.Mark.Index, len(e.Events), e.Events, len(w), w)
		}
		for j := range w {
			g := e.Events[j]
			if g.Kind != w[j].Kind || !proto.Equal(g.KV, w[j].KV) || !proto.Equal(g.Prev, w[j].Prev) || g.Revision != w[j].KV.GetModRevision() {
				t.Fatalf("entry %d event %d: %v %v prev %v at %d; want %v %v prev %v", e.Mark.Index, j,
					g.Kind, g.KV, g.Prev, g.Revision, w[j].Kind, w[j].KV, w[j].Prev)
			}
		}
	}
	if got := entries[len(entries)-1].Mark.Index; got != last {
		t.Fatalf("the WAL ends at entry %d, want %d", got, last)
	}
	t.Logf("checked the events of entries %d-%d", first, last)
}

// checkReads compares a few Gets and a full Scan (both directions) with the
// model.
func checkReads(t *testing.T, s *Shard, m *model, rng *rand.Rand, now int64) {
	t.Helper()
	for range 3 {
		k := fmt.Sprintf("k%02d", 5+rng.IntN(30))
		kv, rev, err := s.Get([]byte(k), now)
		if err != nil {
			t.Fatal(err)
		}
		var want *shalev1.KeyValue
		if r, ok := m.live(k, now); ok {
			want = m.kvOf(k, r)
		}
		if !proto.Equal(kv, want) || rev != m.rev {
			t.Fatalf("Get(%s) = %v rev %d, want %v rev %d", k, kv, rev, want, m.rev)
		}
	}
	var want []*shalev1.KeyValue
	for _, k := range slices.Sorted(maps.Keys(m.kv)) {
		if r, ok := m.live(k, now); ok {
			want = append(want, m.kvOf(k, r))
		}
	}
	for _, reverse := range []bool{false, true} {
		page, err := s.Scan(ScanParams{Reverse: reverse, Now: now})
		kvs, more, rev := page.KVs, page.More, page.Revision
		if err != nil {
			t.Fatal(err)
		}
		if reverse {
			slices.Reverse(kvs)
		}
		if more || rev != m.rev || len(kvs) != len(want) {
			t.Fatalf("Scan(reverse=%v): %d keys more=%v rev %d; want %d keys rev %d", reverse, len(kvs), more, rev, len(want), m.rev)
		}
		for i := range kvs {
			if !proto.Equal(kvs[i], want[i]) {
				t.Fatalf("Scan(reverse=%v)[%d] = %v, want %v", reverse, i, kvs[i], want[i])
			}
		}
	}
}
