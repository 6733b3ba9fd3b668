package shard

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/storage"
)

// Apply applies committed entries in order. All their effects, together
// with the new applied index and term, configuration, descriptor, revision
// and dedup-table bounds, are written in one storage batch (not synced: the
// Raft log is the durable record), so a restart resumes exactly after the
// last entry of some complete Apply call. Later entries (and later ops of a
// command) see the writes of earlier ones. Each entry's writes are
// followed in the batch by its entry record (its EntryMark and changes), as
// LogData.
//
// It returns one result per entry (Applied.Results): a *shalev1.CommandResult for every entry
// carrying a Txn or SystemCommand (including commands rejected at apply,
// which carry an error code and change nothing), nil for empty entries,
// no-ops and configuration changes. Entries at or below the applied index
// are skipped (nil result). Results depend only on the entries and the
// state, so every replica computes the same ones.
//
// An entry whose Decoded is a *shalev1.RaftCommand is applied from it, not
// from its Payload, which it must equal as decoding and expanding the
// payload would give it: the long form (a transaction, not the compact put
// command; timestamp_unix_nanos in full, no wall_offset_nanos), as the
// server's encodeCommand leaves the command it encodes. Apply only reads
// it.
//
// An error (engine I/O or corrupt stored data) means nothing of this call
// was applied and the Shard stops: every later Apply returns the error.
func (s *Shard) Apply(entries []replication.Entry) (replication.Applied, error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if err := s.failure(); err != nil {
		return replication.Applied{}, err
	}
	if s.db == nil {
		return replication.Applied{}, ErrClosed
	}
	if len(entries) == 0 {
		return replication.Applied{}, nil
	}
	cur := s.st.Load()
	ns := *cur
	if s.applyBatch == nil {
		s.applyBatch, s.applyWrites = storage.NewBatch(), map[string]ovWrite{}
	}
	defer func() {
		// The engine keeps nothing of an applied batch: reuse it, unless one
		// large command made it big.
		if s.applyBatch.Len() > 1<<20 || len(s.applyWrites) > 4096 {
			s.applyBatch, s.applyWrites = nil, nil
			return
		}
		s.applyBatch.Reset()
		clear(s.applyWrites)
	}()
	a := &applier{s: s, st: &ns, written: cur, b: s.applyBatch, ov: overlay{db: s.db, writes: s.applyWrites,
		records: s.opts.RecordCache, space: &s.recordSpace, keyBuf: &s.recordKeyBuf}}
	results := make([]any, len(entries))
	applied := false
	for i := range entries {
		e := &entries[i]
		if e.Index <= a.st.index {
			continue
		}
		if e.Part == 0 {
			// A packed entry's parts share its date, range record and
			// entry record.
			a.proposedAt, a.logRev = nil, 0
			a.before = a.st.desc
		}
		a.packed = e.Parts > 0
		res, err := a.applyEntry(e)
		last := e.Part+1 >= e.Parts
		if err == nil && last {
			err = a.endEntryLog(a.before)
		}
		if err != nil {
			a.closeEffects()
			return replication.Applied{}, s.fail(fmt.Errorf("shard %s: apply entry %d: %w", s.dir, e.Index, err))
		}
		results[i] = res
		if !last {
			continue
		}
		a.st.index, a.st.term = e.Index, e.Term
		a.st.hlc = entryDate(a.st.hlc, a.proposedAt)
		a.mark = appendEntryRecord(a.mark[:0], EntryMark{ShardID: a.st.desc.GetShardId(), Index: e.Index, Term: e.Term, HLC: a.st.hlc, Revision: a.st.rev}, a.changes)
		a.b.LogData(a.mark)
		a.changes = a.changes[:0]
		applied = true
	}
	if !applied {
		return replication.Applied{Results: results}, nil
	}
	a.st.writeMeta(a.b, a.written)
	if err := s.writeBatch(a.st.desc.GetShardId(), entries, a.b); err != nil {
		a.closeEffects()
		return replication.Applied{}, s.fail(fmt.Errorf("shard %s: write entries %d-%d: %w", s.dir, entries[0].Index, entries[len(entries)-1].Index, err))
	}
	a.ov.remember()
	s.publish(a.st)
	s.notifyChanged()
	for _, fn := range a.after {
		if err := fn(); err != nil {
			a.closeEffects()
			return replication.Applied{}, s.fail(fmt.Errorf("shard %s: %w", s.dir, err))
		}
	}
	return replication.Applied{Results: results, Effects: a.effects}, nil
}

// closeEffects closes the state machines of the call's HostShard effects,
// which a failed call does not hand to the Store.
func (a *applier) closeEffects() {
	for _, e := range a.effects {
		if h, ok := e.(replication.HostShard); ok {
			_ = h.StateMachine.Close()
		}
	}
}

// ovWrite is a write staged in the current batch: a value or a deletion.
type ovWrite struct {
	val []byte
	del bool
}

// overlay answers reads during an Apply call: the writes staged in the
// batch so far, over the engine's state before the call (the records of
// user keys from the record cache when it has them, which holds what the
// engine holds).
type overlay struct {
	db     *storage.DB
	writes map[string]ovWrite
	// rangeDels are the engine-key spans [lo, hi) deleted in this batch;
	// a data key in one of them that has no later point write is absent.
	rangeDels [][2][]byte
	// forget is set when one of rangeDels deleted records of the shard's
	// own range (delRange, not giveAway): remember then forgets every
	// cached record.
	forget bool
	// records is the node's record cache (nil: none), in which the shard's
	// entries are in *space; keys are built in *keyBuf.
	records *RecordCache
	space   **recordSpace
	keyBuf  *[]byte
}

// get returns key's current value (nil, false when absent).
func (o *overlay) get(key []byte) ([]byte, bool, error) {
	if w, ok := o.writes[string(key)]; ok {
		if w.del {
			return nil, false, nil
		}
		return w.val, true, nil
	}
	if o.rangeDeleted(key) {
		return nil, false, nil
	}
	if o.records != nil && isDataKey(key) {
		sp := *o.space
		*o.keyBuf = recordKey(*o.keyBuf, sp.id, key)
		if raw, present, ok := o.records.get(*o.keyBuf, sp); ok {
			return raw, present, nil
		}
	}
	return getOpt(o.db, key)
}

// remember puts the staged writes of user keys into the record cache,
// once the engine holds them; a batch that deleted a range of the shard's
// own (delRange) makes the shard forget every cached record instead. The
// cache keeps the staged values, which nothing modifies once staged (each
// is a new encoding, or a copy).
func (o *overlay) remember() {
	if o.records == nil {
		return
	}
	if o.forget {
		*o.space = o.records.namespace()
		return
	}
	sp := *o.space
	for k, w := range o.writes {
		if len(k) == 0 || k[0] != prefixData {
			continue
		}
		*o.keyBuf = recordKey(*o.keyBuf, sp.id, []byte(k))
		o.records.put(*o.keyBuf, w.val, !w.del, sp)
	}
}

// rangeDeleted reports whether a range deletion of this batch covers key.
func (o *overlay) rangeDeleted(key []byte) bool {
	for _, rd := range o.rangeDels {
		if bytes.Compare(key, rd[0]) >= 0 && bytes.Compare(key, rd[1]) < 0 {
			return true
		}
	}
	return false
}

func (o *overlay) set(b *storage.Batch, key, val []byte) {
	b.Set(key, val)
	o.writes[string(key)] = ovWrite{val: val}
}

func (o *overlay) del(b *storage.Batch, key []byte) {
	b.Delete(key)
	o.writes[string(key)] = ovWrite{del: true}
}

func (o *overlay) delRange(b *storage.Batch, lo, hi []byte) {
	o.giveAway(b, lo, hi)
	o.forget = true
}

// giveAway deletes [lo, hi), a range the shard stops holding in this
// batch (the half a split gives to its new shard), as delRange does, but
// keeps the shard's cached records: no later apply of this shard reads a
// key of that range (its commands there are refused, and a merge that
// brings the range back deletes it first, with delRange), so the records
// cached for the rest of the shard stay exact, and a shard that knew every
// key it held still does.
func (o *overlay) giveAway(b *storage.Batch, lo, hi []byte) {
	b.DeleteRange(lo, hi)
	for k := range o.writes {
		if k >= string(lo) && k < string(hi) {
			o.writes[k] = ovWrite{del: true}
		}
	}
	o.rangeDels = append(o.rangeDels, [2][]byte{lo, hi})
}

// applier stages one Apply call: the next state, the batch and the overlay.
type applier struct {
	s  *Shard
	st *state
	// written is the state whose metadata the engine holds (or will, once
	// the batch is written): writeMeta writes only what changed since.
	written *state
	b       *storage.Batch
	ov      overlay
	// after runs once the call's state is published (a split opens its new
	// shard).
	after []func() error
	// effects are the call's effects for the Store (a split's new shard).
	effects []replication.Effect
	// proposedAt is the current entry's proposer's clock reading, if any
	// (a packed entry's: its latest command's).
	proposedAt *shalev1.HlcTimestamp
	// before is the descriptor before the current entry.
	before *shalev1.ShardDescriptor
	// packed is set while a part of a packed entry applies (Entry.Parts).
	packed bool
	// logRev is the revision the current entry's record says its next
	// delete item is at: that of its last revision item, 0 before one.
	logRev uint64
	// mark is a buffer for encoding entry records.
	mark []byte
	// keyBuf is dataKeyBuf's buffer.
	keyBuf []byte
	// changes are the current entry's change items (appendChangeItem), for
	// its entry record.
	changes []byte
}

// getData returns the stored record of the user key whose engine key is ek,
// or nil when it is physically absent (expired records are returned).
func (a *applier) getData(ek []byte) (*storedValue, error) {
	return a.getDataInto(ek, new(storedValue))
}

// getDataInto is getData that decodes the record into dst (returning dst,
// or nil).
func (a *applier) getDataInto(ek []byte, dst *storedValue) (*storedValue, error) {
	raw, ok, err := a.ov.get(ek)
	if err != nil || !ok {
		return nil, err
	}
	v, err := decodeValue(raw)
	if err != nil {
		return nil, fmt.Errorf("key %q: %w", ek[1:], err)
	}
	*dst = v
	return dst, nil
}

// dataKeyBuf returns the engine key of a user key, built in a buffer of
// the applier that the next call reuses.
func (a *applier) dataKeyBuf(userKey []byte) []byte {
	a.keyBuf = append(append(a.keyBuf[:0], prefixData), userKey...)
	return a.keyBuf
}

func (a *applier) applyEntry(e *replication.Entry) (any, error) {
	if e.ConfChange != nil {
		return nil, a.applyConfChange(e.ConfChange)
	}
	if len(e.Payload) == 0 {
		return nil, nil
	}
	cmd, ok := e.Decoded.(*shalev1.RaftCommand)
	if !ok {
		cmd = &shalev1.RaftCommand{}
		if err := codec.Unmarshal(e.Payload, cmd); err != nil {
			a.s.log.Warn("shard: malformed command", "index", e.Index, "err", err)
			return errResult(codes.InvalidArgument, nil, "malformed command: %v", err), nil
		}
		expandCommand(cmd)
	}
	if e.Parts > 0 {
		switch cmd.GetCommand().(type) {
		case *shalev1.RaftCommand_Txn, *shalev1.RaftCommand_Noop, nil:
		default:
			// Every replica refuses it alike: the proposer packs only
			// transactions (the others' apply sees whole entries).
			return errResult(codes.InvalidArgument, nil, "a %T command cannot share a Raft entry", cmd.GetCommand()), nil
		}
	}
	if ts := cmd.GetHlc(); ts != nil {
		a.proposedAt = ts
	}
	res, err := a.applyCommand(cmd)
	if err != nil || res == nil {
		return nil, err // an untyped nil for commands without a result
	}
	return res, nil
}

func errResult(code codes.Code, desc *shalev1.ShardDescriptor, format string, args ...any) *shalev1.CommandResult {
	return &shalev1.CommandResult{
		ErrorCode:    uint32(code),
		ErrorMessage: fmt.Sprintf(format, args...),
		Descriptor_:  cloneDesc(desc),
	}
}

// applyCommand applies one RaftCommand; a nil result means the command
// produces none (no-op).
func (a *applier) applyCommand(cmd *shalev1.RaftCommand) (*shalev1.CommandResult, error) {
	id := cmd.GetRequestId()
	// A first attempt's ID was never proposed before, so it cannot be in the
	// table: skip the lookup (the ID is still recorded below).
	if len(id) > 0 && !cmd.GetFirstAttempt() {
		if res, ok, err := a.dedupLookup(id); err != nil || ok {
			return res, err
		}
	}
	desc := a.st.desc
	if cmd.GetEpoch() != 0 && (desc == nil || cmd.GetEpoch() != desc.GetEpoch()) {
		return errResult(codes.FailedPrecondition, desc, "shard epoch mismatch: command epoch %d, shard epoch %d",
			cmd.GetEpoch(), desc.GetEpoch()), nil
	}
	if desc.GetMergingInto() != 0 {
		switch cmd.GetCommand().(type) {
		case *shalev1.RaftCommand_Txn, *shalev1.RaftCommand_Split, *shalev1.RaftCommand_MergeAbsorb, *shalev1.RaftCommand_Expire:
			return errResult(codes.Unavailable, desc, "shard %d is being merged into shard %d", desc.GetShardId(), desc.GetMergingInto()), nil
		}
	}
	var res *shalev1.CommandResult
	var wrote bool
	var err error
	switch c := cmd.GetCommand().(type) {
	case *shalev1.RaftCommand_Txn:
		res, wrote, err = a.applyTxn(c.Txn, cmd.GetTimestampUnixNanos())
	case *shalev1.RaftCommand_System:
		res, wrote, err = a.applySystem(c.System)
	case *shalev1.RaftCommand_Split:
		res, wrote, err = a.applySplit(c.Split)
	case *shalev1.RaftCommand_MergeFreeze:
		res, wrote, err = a.applyMergeFreeze(c.MergeFreeze)
	case *shalev1.RaftCommand_MergeAbsorb:
		res, wrote, err = a.applyMergeAbsorb(c.MergeAbsorb)
	case *shalev1.RaftCommand_MergeRetire:
		res, wrote, err = a.applyMergeRetire()
	case *shalev1.RaftCommand_Expire:
		res, wrote, err = a.applyExpire(c.Expire, cmd.GetTimestampUnixNanos())
	default: // noop, or no command at all
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if wrote && len(id) > 0 {
		if err := a.dedupStore(id, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// dedupLookup returns the stored result of request id, if the table holds
// it (an entry below the oldest live sequence was evicted). While entries
// of an older format may be live, an ID not found under dedupPrefix is
// looked up under legacyDedupPrefix too.
func (a *applier) dedupLookup(id []byte) (*shalev1.CommandResult, bool, error) {
	raw, ok, err := a.ov.get(dedupKey(id))
	if err != nil {
		return nil, false, err
	}
	if ok {
		return decodeDedupEntry(id, raw, a.st.dedupOldest, false)
	}
	if a.st.dedupOldest >= a.st.dedupLegacyEnd {
		return nil, false, nil // no entry of an older format is live
	}
	if raw, ok, err = a.ov.get(legacyDedupKey(id)); err != nil || !ok {
		return nil, false, err
	}
	return decodeDedupEntry(id, raw, a.st.dedupOldest, true)
}

// appendDedupEntry appends the dedup table's entry of a result to buf: its
// insertion sequence as a uvarint, then the result, encoded by its
// generated method, which writes what marshalOpts would (a CommandResult
// has no map).
func appendDedupEntry(buf []byte, seq uint64, res *shalev1.CommandResult) ([]byte, error) {
	buf = binary.AppendUvarint(buf, seq)
	buf, err := codec.MarshalAppend(buf, res)
	if err != nil {
		return nil, fmt.Errorf("encode result: %w", err)
	}
	return buf, nil
}

// splitDedupEntry splits a dedup entry into its insertion sequence and its
// encoded result; legacy selects the 8-byte big-endian sequence of formats
// 1 to 5 (legacyDedupPrefix). ok is false for an entry too short to hold a
// sequence.
func splitDedupEntry(raw []byte, legacy bool) (seq uint64, result []byte, ok bool) {
	if legacy {
		if len(raw) < 8 {
			return 0, nil, false
		}
		return binary.BigEndian.Uint64(raw), raw[8:], true
	}
	seq, n := binary.Uvarint(raw)
	if n <= 0 {
		return 0, nil, false
	}
	return seq, raw[n:], true
}

// decodeDedupEntry decodes the dedup table's entry raw of request id (of
// an older format when legacy is set): its stored result, or ok false when
// the entry's sequence is below oldest (evicted).
func decodeDedupEntry(id, raw []byte, oldest uint64, legacy bool) (*shalev1.CommandResult, bool, error) {
	seq, enc, ok := splitDedupEntry(raw, legacy)
	if !ok {
		return nil, false, fmt.Errorf("%w: dedup entry of %x: no sequence in %d bytes", ErrCorrupt, id, len(raw))
	}
	if seq < oldest {
		return nil, false, nil
	}
	res := &shalev1.CommandResult{}
	if err := codec.Unmarshal(enc, res); err != nil {
		return nil, false, fmt.Errorf("%w: dedup entry of %x: %v", ErrCorrupt, id, err)
	}
	return res, true, nil
}

// dedupStore records res under id. While the table is full, the oldest
// entry is evicted: the oldest live sequence moves past it, which makes it
// absent without a read or a write (compactions drop it, dedupFilter).
func (a *applier) dedupStore(id []byte, res *shalev1.CommandResult) error {
	seq := a.st.dedupNext
	val, err := appendDedupEntry(make([]byte, 0, binary.MaxVarintLen64+codec.Size(res)), seq, res)
	if err != nil {
		return err
	}
	a.st.dedupNext++
	if a.st.dedupNext-a.st.dedupOldest > a.s.dedupCap {
		a.st.dedupOldest = a.st.dedupNext - a.s.dedupCap
	}
	a.ov.set(a.b, dedupKey(id), val)
	return nil
}

// shardRange returns the user-key range of desc.
func shardRange(desc *shalev1.ShardDescriptor) keyRange {
	start := desc.GetStartKey()
	if start == nil {
		start = []byte{}
	}
	return keyRange{start: start, end: endOrNil(desc.GetEndKey())}
}

// isWrite reports whether op writes.
func isWrite(op *shalev1.RequestOp) bool {
	switch op.GetOp().(type) {
	case *shalev1.RequestOp_Put, *shalev1.RequestOp_Delete, *shalev1.RequestOp_DeleteRange:
		return true
	}
	return false
}

// applyTxn evaluates and applies a Txn. wrote reports whether it bumped the
// revision (the chosen branch holds a write op).
func (a *applier) applyTxn(txn *shalev1.TxnRequest, now int64) (*shalev1.CommandResult, bool, error) {
	desc := a.st.desc
	if desc == nil {
		return errResult(codes.FailedPrecondition, nil, "shard replica is not initialized"), false, nil
	}
	if desc.GetSystem() {
		return errResult(codes.InvalidArgument, desc, "the system shard holds no user keys"), false, nil
	}
	// The server checked the command before proposing it; check it again
	// against the descriptor it applies under (without the node's size
	// limits, which replicas need not share).
	if inv := CheckTxn(txn, Limits{}, RequestTxn); inv != nil {
		return errResult(inv.Code, desc, "%s", inv.Message), false, nil
	}
	if inv := TxnInShard(txn, desc); inv != nil {
		return errResult(inv.Code, desc, "%s", inv.Message), false, nil
	}

	succeeded := true
	for _, c := range txn.GetCompares() {
		ok, err := a.compare(c, now)
		if err != nil {
			return nil, false, err
		}
		if !ok {
			succeeded = false
			break
		}
	}
	ops := txn.GetSuccess()
	if !succeeded {
		ops = txn.GetFailure()
	}
	wrote := slices.ContainsFunc(ops, isWrite)
	rev := a.st.rev
	if wrote {
		rev++
		a.st.rev = rev
	}
	// The result's messages in one allocation, with room for one op's.
	out := &txnResult{}
	results := out.one[:0]
	if len(ops) > 1 {
		results = make([]*shalev1.ResponseOp, 0, len(ops))
	}
	rng := shardRange(desc)
	for _, op := range ops {
		r, err := a.execOp(op, rng, now, rev)
		if err != nil {
			return nil, false, err
		}
		results = append(results, r)
	}
	out.header.ShardId, out.header.Revision, out.header.Epoch = desc.GetShardId(), rev, desc.GetEpoch()
	out.txn.Header, out.txn.Succeeded, out.txn.Results = &out.header, succeeded, results
	out.res.Txn = &out.txn
	return &out.res, wrote, nil
}

// txnResult is a transaction's result and the messages it points to,
// allocated together: its response, header, and the results of a
// transaction of one op.
type txnResult struct {
	res    shalev1.CommandResult
	txn    shalev1.TxnResponse
	header shalev1.ResponseHeader
	one    [1]*shalev1.ResponseOp
}

// putResult is a put's result messages, allocated together.
type putResult struct {
	op   shalev1.ResponseOp
	put  shalev1.ResponseOp_Put
	resp shalev1.PutResponse
}

// compare evaluates one Compare against the current state. As in etcd, a
// value compare against an absent key is false whatever its operator; the
// numeric targets of an absent key are 0.
func (a *applier) compare(c *shalev1.Compare, now int64) (bool, error) {
	v, err := a.getData(dataKey(c.GetKey()))
	if err != nil {
		return false, err
	}
	present := live(v, now)
	var r int
	switch c.GetTarget() {
	case shalev1.Compare_TARGET_VALUE_UNSPECIFIED:
		if !present {
			return false, nil
		}
		r = bytes.Compare(v.value, c.GetValue())
	case shalev1.Compare_TARGET_EXISTS:
		var n uint64
		if present {
			n = 1
		}
		r = cmp.Compare(n, c.GetNumber())
	default:
		var n uint64
		if present {
			switch c.GetTarget() {
			case shalev1.Compare_TARGET_VERSION:
				n = v.version
			case shalev1.Compare_TARGET_CREATE_REVISION:
				n = v.createRev
			case shalev1.Compare_TARGET_MOD_REVISION:
				n = v.modRev
			}
		}
		r = cmp.Compare(n, c.GetNumber())
	}
	switch c.GetResult() {
	case shalev1.Compare_RESULT_EQUAL_UNSPECIFIED:
		return r == 0, nil
	case shalev1.Compare_RESULT_NOT_EQUAL:
		return r != 0, nil
	case shalev1.Compare_RESULT_GREATER:
		return r > 0, nil
	default: // RESULT_LESS (validated)
		return r < 0, nil
	}
}

// execOp applies one validated op at revision rev.
func (a *applier) execOp(op *shalev1.RequestOp, rng keyRange, now int64, rev uint64) (*shalev1.ResponseOp, error) {
	switch o := op.GetOp().(type) {
	case *shalev1.RequestOp_Put:
		p := o.Put
		ek := a.dataKeyBuf(p.GetKey())
		var oldV storedValue
		old, err := a.getDataInto(ek, &oldV)
		if err != nil {
			return nil, err
		}
		nv := storedValue{createRev: rev, modRev: rev, version: 1, expire: expiryOf(now, p.GetTtlMs()), value: p.GetValue()}
		out := &putResult{}
		resp := &out.resp
		change := byte(changePutNew)
		if live(old, now) {
			nv.createRev, nv.version = old.createRev, old.version+1
			change = changePutOver
			if p.GetPrevKv() {
				resp.PrevKv = keyValue(p.GetKey(), old, false)
			}
		}
		a.noteChange(change, p.GetKey())
		a.ov.set(a.b, ek, encodeValue(make([]byte, 0, nv.encodedSize()), &nv))
		if nv.expire != 0 {
			a.s.ttlWrites.Add(1)
			a.st.noTTL = false
		}
		out.put.Put = resp
		out.op.Op = &out.put
		return &out.op, nil

	case *shalev1.RequestOp_Delete:
		d := o.Delete
		ek := a.dataKeyBuf(d.GetKey())
		var oldV storedValue
		old, err := a.getDataInto(ek, &oldV)
		if err != nil {
			return nil, err
		}
		resp := &shalev1.DeleteResponse{}
		if live(old, now) {
			a.noteChange(changeDeleteOf, d.GetKey())
			resp.Deleted = 1
			if d.GetPrevKv() {
				resp.PrevKv = keyValue(d.GetKey(), old, false)
			}
		}
		if old != nil {
			a.ov.del(a.b, ek)
		}
		return &shalev1.ResponseOp{Op: &shalev1.ResponseOp_Delete{Delete: resp}}, nil

	case *shalev1.RequestOp_DeleteRange:
		r, _ := deleteRangeInShard(o.DeleteRange, rng) // validated by TxnInShard
		lo, hi := dataKey(r.start), dataBound(r.end)
		if err := a.noteRangeDeletes(lo, hi, now); err != nil {
			return nil, err
		}
		a.ov.delRange(a.b, lo, hi)
		return &shalev1.ResponseOp{Op: &shalev1.ResponseOp_DeleteRange{DeleteRange: &shalev1.DeleteRangeResponse{}}}, nil

	case *shalev1.RequestOp_Get:
		g := o.Get
		v, err := a.getData(dataKey(g.GetKey()))
		if err != nil {
			return nil, err
		}
		resp := &shalev1.GetResponse{}
		if live(v, now) {
			resp.Kv = keyValue(g.GetKey(), v, false)
		}
		return &shalev1.ResponseOp{Op: &shalev1.ResponseOp_Get{Get: resp}}, nil
	}
	return nil, errors.New("unvalidated request op") // unreachable: validated
}

// applySystem applies a SystemCommand on the system shard.
func (a *applier) applySystem(sc *shalev1.SystemCommand) (*shalev1.CommandResult, bool, error) {
	desc := a.st.desc
	if desc == nil || !desc.GetSystem() {
		return errResult(codes.InvalidArgument, desc, "system command on a non-system shard"), false, nil
	}
	switch op := sc.GetOp().(type) {
	case *shalev1.SystemCommand_PutNode:
		n := op.PutNode
		if n.GetNodeId() == 0 {
			return errResult(codes.InvalidArgument, desc, "put_node needs a node_id"), false, nil
		}
		enc, err := marshalOpts.Marshal(n)
		if err != nil {
			return nil, false, fmt.Errorf("encode node: %w", err)
		}
		a.ov.set(a.b, u64Key(nodePrefix, n.GetNodeId()), enc)
	case *shalev1.SystemCommand_RemoveNodeId:
		if op.RemoveNodeId == 0 {
			return errResult(codes.InvalidArgument, desc, "remove_node_id must be non-zero"), false, nil
		}
		a.ov.del(a.b, u64Key(nodePrefix, op.RemoveNodeId))
	case *shalev1.SystemCommand_PutShard:
		d := op.PutShard
		if d.GetShardId() == 0 {
			return errResult(codes.InvalidArgument, desc, "put_shard needs a shard_id"), false, nil
		}
		key := u64Key(shardPrefix, d.GetShardId())
		raw, ok, err := a.ov.get(key)
		if err != nil {
			return nil, false, err
		}
		if ok {
			old := &shalev1.ShardDescriptor{}
			if err := proto.Unmarshal(raw, old); err != nil {
				return nil, false, fmt.Errorf("%w: shard %d descriptor: %v", ErrCorrupt, d.GetShardId(), err)
			}
			if d.GetEpoch() < old.GetEpoch() {
				return errResult(codes.FailedPrecondition, old, "put_shard: shard %d epoch %d is older than the stored epoch %d",
					d.GetShardId(), d.GetEpoch(), old.GetEpoch()), false, nil
			}
		}
		enc, err := marshalOpts.Marshal(d)
		if err != nil {
			return nil, false, fmt.Errorf("encode shard descriptor: %w", err)
		}
		a.ov.set(a.b, key, enc)
	case *shalev1.SystemCommand_PutPin:
		pin := op.PutPin
		if pin.GetShardId() == 0 {
			return errResult(codes.InvalidArgument, desc, "put_pin needs a shard_id"), false, nil
		}
		key := u64Key(pinPrefix, pin.GetShardId())
		if pin.GetUntilUnixNanos() == 0 {
			a.ov.del(a.b, key)
			break
		}
		enc, err := marshalOpts.Marshal(pin)
		if err != nil {
			return nil, false, fmt.Errorf("encode shard pin: %w", err)
		}
		a.ov.set(a.b, key, enc)
	case *shalev1.SystemCommand_RemoveShardId:
		if op.RemoveShardId == 0 {
			return errResult(codes.InvalidArgument, desc, "remove_shard_id must be non-zero"), false, nil
		}
		a.ov.del(a.b, u64Key(shardPrefix, op.RemoveShardId))
	case *shalev1.SystemCommand_PutAuth:
		pa := op.PutAuth
		if pa.GetState() == nil || pa.GetState().GetRevision() != pa.GetExpectedRevision()+1 {
			return errResult(codes.InvalidArgument, desc, "put_auth: the new revision must be expected_revision + 1"), false, nil
		}
		raw, ok, err := a.ov.get(keyAuthState)
		if err != nil {
			return nil, false, err
		}
		var stored uint64
		if ok {
			cur := &shalev1.AuthState{}
			if err := proto.Unmarshal(raw, cur); err != nil {
				return nil, false, fmt.Errorf("%w: auth state: %v", ErrCorrupt, err)
			}
			stored = cur.GetRevision()
		}
		if stored != pa.GetExpectedRevision() {
			return errResult(codes.Aborted, desc, "put_auth: the auth state is at revision %d, not %d", stored, pa.GetExpectedRevision()), false, nil
		}
		enc, err := marshalOpts.Marshal(pa.GetState())
		if err != nil {
			return nil, false, fmt.Errorf("encode auth state: %w", err)
		}
		a.ov.set(a.b, keyAuthState, enc)
	case *shalev1.SystemCommand_AllocateShardId:
		raw, ok, err := a.ov.get(keyNextShardID)
		if err != nil {
			return nil, false, err
		}
		next := op.AllocateShardId
		if ok {
			if len(raw) != 8 {
				return nil, false, fmt.Errorf("%w: next shard ID is %d bytes", ErrCorrupt, len(raw))
			}
			next = max(next, binary.BigEndian.Uint64(raw))
		}
		if next == 0 || next == math.MaxUint64 {
			return errResult(codes.InvalidArgument, desc, "allocate_shard_id: no shard ID at or above %d", op.AllocateShardId), false, nil
		}
		a.ov.set(a.b, keyNextShardID, binary.BigEndian.AppendUint64(nil, next+1))
		a.st.rev++
		return &shalev1.CommandResult{AllocatedId: next}, true, nil
	default:
		return errResult(codes.InvalidArgument, desc, "system command without an operation"), false, nil
	}
	a.st.rev++
	return &shalev1.CommandResult{Txn: &shalev1.TxnResponse{
		Header:    &shalev1.ResponseHeader{ShardId: desc.GetShardId(), Revision: a.st.rev, Epoch: desc.GetEpoch()},
		Succeeded: true,
	}}, true, nil
}

// applyConfChange records a configuration change: the new ConfState, and a
// descriptor whose replicas are exactly the members of that ConfState with
// roles derived from it, a bumped epoch and next_replica_id past every
// added ID.
func (a *applier) applyConfChange(cc *replication.AppliedConfChange) error {
	cs := cloneConfState(cc.ConfState)
	desc := nextDescriptor(a.st.desc, cc, cs, a.s)
	if err := a.st.setConf(cs); err != nil {
		return err
	}
	return a.st.setDesc(desc)
}

// nextDescriptor computes the descriptor after a configuration change.
func nextDescriptor(cur *shalev1.ShardDescriptor, cc *replication.AppliedConfChange, cs *raftpb.ConfState, s *Shard) *shalev1.ShardDescriptor {
	nd := &shalev1.ShardDescriptor{}
	if cur != nil {
		nd = cloneDesc(cur)
	}
	members := map[uint64]bool{}
	for _, set := range [][]uint64{cs.GetVoters(), cs.GetVotersOutgoing(), cs.GetLearners(), cs.GetLearnersNext()} {
		for _, id := range set {
			members[id] = true
		}
	}
	nodeOf := map[uint64]uint64{}
	for _, r := range cc.Context.GetReplicas() {
		nodeOf[r.GetReplicaId()] = r.GetNodeId()
	}
	find := func(id uint64) int {
		return slices.IndexFunc(nd.Replicas, func(r *shalev1.ReplicaDescriptor) bool { return r.GetReplicaId() == id })
	}
	add := func(id uint64) {
		node, known := nodeOf[id]
		if i := find(id); i >= 0 {
			if known && nd.Replicas[i].NodeId == 0 {
				nd.Replicas[i].NodeId = node
			}
			return
		}
		if !known && s != nil {
			s.log.Warn("shard: conf change adds a replica without its node in the context", "replica_id", id)
		}
		nd.Replicas = append(nd.Replicas, &shalev1.ReplicaDescriptor{NodeId: node, ReplicaId: id})
	}
	for _, ch := range cc.Change.GetChanges() {
		id := ch.GetNodeId()
		switch ch.GetType() {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			add(id)
			nd.NextReplicaId = max(nd.NextReplicaId, id+1)
		case raftpb.ConfChangeRemoveNode:
			// A removed voter stays (as VOTER_OUTGOING) while the joint
			// configuration still holds it; the reconciliation below drops
			// it once it is in no configuration.
			if i := find(id); i >= 0 && !members[id] {
				nd.Replicas = slices.Delete(nd.Replicas, i, i+1)
			}
		}
	}
	// The descriptor's replicas are exactly the ConfState's members.
	nd.Replicas = slices.DeleteFunc(nd.Replicas, func(r *shalev1.ReplicaDescriptor) bool { return !members[r.GetReplicaId()] })
	ids := make([]uint64, 0, len(members))
	for id := range members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if find(id) < 0 {
			add(id)
			nd.NextReplicaId = max(nd.NextReplicaId, id+1)
		}
	}
	voters := setOf(cs.GetVoters())
	outgoing := setOf(cs.GetVotersOutgoing())
	joint := len(outgoing) > 0
	for _, r := range nd.Replicas {
		id := r.GetReplicaId()
		switch {
		case voters[id] && (outgoing[id] || !joint):
			r.Role = shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED
		case voters[id]:
			r.Role = shalev1.ReplicaRole_REPLICA_ROLE_VOTER_INCOMING
		case outgoing[id]:
			// Includes a voter being demoted (also in LearnersNext): it
			// still votes in the outgoing configuration.
			r.Role = shalev1.ReplicaRole_REPLICA_ROLE_VOTER_OUTGOING
		default:
			r.Role = shalev1.ReplicaRole_REPLICA_ROLE_LEARNER
		}
	}
	nd.Epoch++
	return nd
}

func setOf(ids []uint64) map[uint64]bool {
	m := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}
