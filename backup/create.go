package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/internal/parallel"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// maxFiles bounds the files a node's header may list.
const maxFiles = 100_000

// Cluster is what Create needs of a cluster; *client.Client (the Go SDK)
// provides it.
type Cluster interface {
	// ClusterStatus gives the cluster's ID.
	ClusterStatus(ctx context.Context) (*shalev1.ClusterStatusResponse, error)
	// ListShards gives every shard's descriptor and leader.
	ListShards(ctx context.Context) ([]*shalev1.ShardStatus, error)
	// BackupShard opens Admin.BackupShard on a node.
	BackupShard(ctx context.Context, nodeID, shardID uint64, skip []*shalev1.SnapshotFile) (shalev1.Admin_BackupShardClient, error)
	// BackupShardLog opens Admin.BackupShardLog on a node.
	BackupShardLog(ctx context.Context, nodeID, shardID, afterIndex uint64) (shalev1.Admin_BackupShardLogClient, error)
	// BackupShardTo calls Admin.BackupShardTo on a node.
	BackupShardTo(ctx context.Context, nodeID uint64, req *shalev1.BackupShardToRequest) (*shalev1.BackupShardToResponse, error)
}

// CreateOptions configure Create.
type CreateOptions struct {
	// ID names the backup. Default: the start time, UTC,
	// "20060102T150405Z".
	ID string
	// Base, if set, makes the backup incremental: the ID of an earlier
	// complete backup of the same cluster in the location. A shard whose
	// range is unchanged since then gets the base's part plus the entries
	// it applied since (its log, from any replica); the others, and those
	// whose log no longer reaches back, get a new checkpoint.
	Base string
	// Progress, if set, is called after every shard's part (from the
	// goroutines copying the parts, one call at a time).
	Progress func(Progress)
	// Parallel is how many shards' parts are copied at once, each by its
	// own node. Default (0): DefaultParallel.
	Parallel int
	// ThroughClient makes every checkpoint travel through Create: the
	// node streams it (Admin.BackupShard) and Create writes it into the
	// location. By default each node writes its checkpoints into the
	// location itself (Admin.BackupShardTo), which then must be reachable
	// from every node under the same name: the same S3 endpoint and
	// bucket, or a directory every node mounts at the same path. A node
	// that does not implement it (an older version), cannot open the
	// location, or opens another location under that name (it does not
	// hold this backup's start marker) streams its parts through Create
	// instead, each time.
	ThroughClient bool
	// NodeCredentials makes the nodes sign their S3 requests with their
	// own credentials (their environment, AWS credentials file or
	// instance role). By default Create sends each node the credentials
	// it signs with itself, in the request (over TLS when the cluster
	// uses it; the RPC requires the admin permission backups require).
	NodeCredentials bool
}

// DefaultParallel is the default CreateOptions.Parallel.
const DefaultParallel = 4

// Progress reports a backup under way.
type Progress struct {
	// ShardsDone of Shards are copied (Shards grows when a split made a
	// shard the backup still needs).
	ShardsDone, Shards int
	// BytesCopied were sent by the nodes; BytesSkipped are in files the
	// location already held.
	BytesCopied, BytesSkipped int64
}

// CreateStats says what a backup copied.
type CreateStats struct {
	FilesCopied, FilesSkipped int
	BytesCopied, BytesSkipped int64
	// Checkpoints counts the parts copied from a new checkpoint, Logs
	// those extended from the base backup with their log (incremental),
	// and LogEntries the entries those logs held.
	Checkpoints, Logs, LogEntries int
	// NodeWritten counts the Checkpoints their nodes wrote into the
	// location themselves; the others were streamed through Create.
	NodeWritten int
}

func (s *CreateStats) add(o CreateStats) {
	s.FilesCopied += o.FilesCopied
	s.FilesSkipped += o.FilesSkipped
	s.BytesCopied += o.BytesCopied
	s.BytesSkipped += o.BytesSkipped
	s.Checkpoints += o.Checkpoints
	s.Logs += o.Logs
	s.LogEntries += o.LogEntries
	s.NodeWritten += o.NodeWritten
}

// Create takes a full backup of the cluster cl reaches into loc: every
// shard's part is a checkpoint of one replica (a follower first, then the
// others), and the parts cover the user key space exactly (splits and
// merges during the backup are followed: a shard missing from the cover is
// fetched when the directory is read again). The manifest is written last;
// on any error, none is, and the backup stays incomplete.
func Create(ctx context.Context, cl Cluster, loc *Location, opts CreateOptions) (*Manifest, CreateStats, error) {
	var stats CreateStats
	started := time.Now().UTC()
	id := opts.ID
	if id == "" {
		id = started.Format("20060102T150405Z")
	}
	if err := ValidID(id); err != nil {
		return nil, stats, fmt.Errorf("backup: %w", err)
	}
	unlock, err := loc.lock(ctx, "create "+id)
	if err != nil {
		return nil, stats, err
	}
	defer unlock()
	st, err := cl.ClusterStatus(ctx)
	if err != nil {
		return nil, stats, fmt.Errorf("backup: cluster status: %w", err)
	}
	m := &Manifest{Format: FormatVersion, ID: id, ClusterID: st.GetClusterId(), Started: started}
	base := map[uint64]*Part{}
	if opts.Base != "" {
		bm, err := loc.Describe(ctx, opts.Base)
		if err != nil {
			return nil, stats, fmt.Errorf("backup: the base backup: %w", err)
		}
		if bm.ClusterID != m.ClusterID {
			return nil, stats, fmt.Errorf("backup: the base backup %s is of cluster %s, not %s", bm.ID, bm.ClusterID, m.ClusterID)
		}
		for i := range bm.Shards {
			base[bm.Shards[i].ShardID] = &bm.Shards[i]
		}
	}

	// Only now, with the base and the cluster known, does the backup exist
	// (incomplete until its manifest is written).
	host, _ := os.Hostname()
	token, err := newToken()
	if err != nil {
		return nil, stats, err
	}
	if err := loc.begin(ctx, id, map[string]any{"id": id, "cluster": m.ClusterID, "base": opts.Base, "host": host, "started": started, "token": token}); err != nil {
		return nil, stats, err
	}
	nw := &nodeWriter{off: map[uint64]bool{}}
	if !opts.ThroughClient {
		where, err := loc.Address()
		if err != nil {
			return nil, stats, err
		}
		nw.req = &shalev1.BackupShardToRequest{Location: where, BackupId: id, Token: token}
		if !opts.NodeCredentials {
			creds, err := loc.s3Credentials()
			if err != nil {
				return nil, stats, err
			}
			if creds != nil {
				nw.req.S3Credentials = &shalev1.S3Credentials{AccessKeyId: creds.AccessKeyID, SecretAccessKey: creds.SecretAccessKey, SessionToken: creds.SessionToken}
			}
		}
	}
	stored, err := loc.storedFiles(ctx)
	if err != nil {
		return nil, stats, err
	}
	parts := map[uint64]*Part{}
	var lastErr error
	for round := 0; round < 10; round++ {
		if round > 0 {
			select {
			case <-ctx.Done():
				return nil, stats, ctx.Err()
			case <-time.After(time.Duration(round) * 200 * time.Millisecond):
			}
		}
		shards, err := cl.ListShards(ctx)
		if err != nil {
			lastErr = fmt.Errorf("list shards: %w", err)
			continue
		}
		var todo []*shalev1.ShardStatus
		for _, s := range shards {
			d := s.GetDescriptor_()
			if _, ok := parts[d.GetShardId()]; !ok && !d.GetRetired() {
				todo = append(todo, s)
			}
		}
		var copyErr error
		if err := copyShards(ctx, cl, loc, nw, todo, base, stored, parts, &stats, opts, &copyErr); err != nil {
			return nil, stats, err
		}
		cover, err := coverKeySpace(parts)
		if err != nil {
			// A shard that could not be copied says why the cover is
			// not whole.
			lastErr = err
			if copyErr != nil {
				lastErr = fmt.Errorf("%w (%v)", copyErr, err)
			}
			continue
		}
		m.Shards = cover
		m.Finished = time.Now().UTC()
		b, err := encodeManifest(m)
		if err != nil {
			return nil, stats, fmt.Errorf("backup: encode the manifest: %w", err)
		}
		if err := loc.st.put(ctx, manifestName(id), bytes.NewReader(b), int64(len(b))); err != nil {
			return nil, stats, fmt.Errorf("backup: write the manifest: %w", err)
		}
		return m, stats, nil
	}
	return nil, stats, fmt.Errorf("backup %s failed (incomplete, no manifest written): %w", id, lastErr)
}

// copyShards copies the parts of the shards in todo, opts.Parallel at a
// time, into parts, adding to stored and stats; a shard that could not be
// copied leaves its error in lastErr (the caller reads the shard list again
// and retries). It returns only ctx's error.
func copyShards(ctx context.Context, cl Cluster, loc *Location, nw *nodeWriter, todo []*shalev1.ShardStatus, base map[uint64]*Part,
	stored map[string]bool, parts map[uint64]*Part, stats *CreateStats, opts CreateOptions, lastErr *error) error {
	atOnce := opts.Parallel
	if atOnce <= 0 {
		atOnce = DefaultParallel
	}
	total := len(parts) + len(todo)
	var mu sync.Mutex // parts, stored, stats, lastErr and Progress calls
	load := &nodeLoad{streams: map[uint64]int{}}
	return parallel.ForEach(ctx, atOnce, len(todo), func(ctx context.Context, i int) error {
		s := todo[i]
		id := s.GetDescriptor_().GetShardId()
		// A part's files are stored under its shard's own prefix: the copy
		// works on those alone, and adds them back.
		prefix := fmt.Sprintf("files/shard-%d/", id)
		mu.Lock()
		own := map[string]bool{}
		for path := range stored {
			if strings.HasPrefix(path, prefix) {
				own[path] = true
			}
		}
		mu.Unlock()
		var st CreateStats
		p, err := copyShard(ctx, cl, loc, nw, s, base[id], own, &st, load)
		mu.Lock()
		defer mu.Unlock()
		maps.Copy(stored, own)
		stats.add(st)
		if err != nil {
			if ctx.Err() == nil {
				*lastErr = err
			}
			return nil
		}
		parts[id] = p
		if opts.Progress != nil {
			opts.Progress(Progress{ShardsDone: len(parts), Shards: total, BytesCopied: stats.BytesCopied, BytesSkipped: stats.BytesSkipped})
		}
		return nil
	})
}

// coverKeySpace picks, from the parts copied, the system shard's and a set
// of user parts that cover the user key space exactly: a part whose range
// lies inside another's (a shard split or merged while the backup ran) is
// left out. A gap or a partial overlap is an error: the directory is read
// again and the missing shards copied.
func coverKeySpace(parts map[uint64]*Part) ([]Part, error) {
	var sys []Part
	var user []*Part
	for _, p := range parts {
		if p.System {
			sys = append(sys, *p)
		} else {
			user = append(user, p)
		}
	}
	if len(sys) != 1 {
		return nil, fmt.Errorf("backup: %d copies of the system shard", len(sys))
	}
	inside := func(a, b *Part) bool { // a's range lies within b's
		return bytes.Compare(a.Start, b.Start) >= 0 && (len(b.End) == 0 || (len(a.End) != 0 && bytes.Compare(a.End, b.End) <= 0))
	}
	var kept []*Part
	for i, a := range user {
		contained := false
		for j, b := range user {
			if i == j || !inside(a, b) {
				continue
			}
			// Two parts of one range (impossible unless a shard kept its
			// range under a new ID): keep the lower ID.
			if inside(b, a) && a.ShardID < b.ShardID {
				continue
			}
			contained = true
			break
		}
		if !contained {
			kept = append(kept, a)
		}
	}
	sort.Slice(kept, func(i, j int) bool { return bytes.Compare(kept[i].Start, kept[j].Start) < 0 })
	var at []byte
	for i, p := range kept {
		if !bytes.Equal(p.Start, at) {
			if i > 0 && bytes.Compare(p.Start, at) < 0 {
				return nil, fmt.Errorf("backup: shards %d and %d overlap at %q", kept[i-1].ShardID, p.ShardID, p.Start)
			}
			return nil, fmt.Errorf("backup: no shard copied covers keys from %q to %q", at, p.Start)
		}
		if len(p.End) == 0 {
			if i != len(kept)-1 {
				return nil, fmt.Errorf("backup: shards %d and %d overlap", p.ShardID, kept[i+1].ShardID)
			}
			out := append(sys, make([]Part, 0, len(kept))...)
			for _, k := range kept {
				out = append(out, *k)
			}
			return out, nil
		}
		at = p.End
	}
	return nil, fmt.Errorf("backup: no shard copied covers keys from %q on", at)
}

// nodeLoad counts the copies each node is sending, so that the shards'
// copies spread over the nodes: a node's sending, not the location, is
// what bounds a backup.
type nodeLoad struct {
	mu      sync.Mutex
	streams map[uint64]int
}

// acquire picks from cands (which it reorders) the node to copy from next —
// the lowest rank (followers before the leader before learners), and among
// equals the one sending the fewest copies — counts one more copy for it
// and returns it with the candidates left.
func (l *nodeLoad) acquire(cands []candidate) (uint64, []candidate) {
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.SortStableFunc(cands, func(a, b candidate) int {
		if a.rank != b.rank {
			return a.rank - b.rank
		}
		return l.streams[a.node] - l.streams[b.node]
	})
	l.streams[cands[0].node]++
	return cands[0].node, cands[1:]
}

// release counts one copy fewer for node.
func (l *nodeLoad) release(node uint64) {
	l.mu.Lock()
	l.streams[node]--
	l.mu.Unlock()
}

// candidate is a node holding a replica of a shard to copy.
type candidate struct {
	node uint64
	rank int // 0: follower, 1: leader, 2: learner
}

// copyShard copies one shard's part from one of its replicas: followers
// first, then the leader, then learners, and among those the nodes
// sending the fewest copies (load) first. With a base part of the same
// range, the part is the base's plus the entries applied since; when no
// replica's log reaches back that far, or the range changed, a new
// checkpoint.
func copyShard(ctx context.Context, cl Cluster, loc *Location, nw *nodeWriter, s *shalev1.ShardStatus, base *Part, stored map[string]bool, stats *CreateStats, load *nodeLoad) (*Part, error) {
	d := s.GetDescriptor_()
	var nodes []candidate
	for _, r := range d.GetReplicas() {
		rank := 0
		switch {
		case r.GetRole() == shalev1.ReplicaRole_REPLICA_ROLE_LEARNER:
			rank = 2
		case r.GetNodeId() == s.GetLeaderNodeId():
			rank = 1
		}
		nodes = append(nodes, candidate{r.GetNodeId(), rank})
	}
	var errs []error
	if base != nil && bytes.Equal(base.Start, d.GetStartKey()) && bytes.Equal(base.End, d.GetEndKey()) {
		for rest := slices.Clone(nodes); len(rest) > 0; {
			var node uint64
			node, rest = load.acquire(rest)
			until := time.Now().UTC()
			seg, err := fetchLog(ctx, cl, loc, node, d.GetShardId(), base.LastIndex())
			load.release(node)
			if err == nil {
				p := *base
				p.Log = slices.Clone(base.Log)
				p.Until = until
				if seg != nil {
					p.Log = append(p.Log, *seg)
					stats.LogEntries += int(seg.ToIndex - seg.FromIndex + 1)
					stats.BytesCopied += int64(seg.Size)
					stats.FilesCopied++
				}
				stats.Logs++
				return &p, nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			errs = append(errs, err)
			if errors.Is(err, errRangeChanged) {
				break
			}
		}
	}
	for rest := nodes; len(rest) > 0; {
		var node uint64
		node, rest = load.acquire(rest)
		p, err := nw.write(ctx, cl, node, d.GetShardId(), stored, stats)
		if errors.Is(err, errNodeCannotWrite) {
			p, err = copyFrom(ctx, cl, loc, node, d.GetShardId(), stored, stats)
		}
		load.release(node)
		if err == nil {
			stats.Checkpoints++
			return p, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("backup: shard %d: no replica could be copied: %w", d.GetShardId(), errors.Join(errs...))
}

// copyFrom copies shard shardID's checkpoint from node, storing the files
// the location does not hold yet.
func copyFrom(ctx context.Context, cl Cluster, loc *Location, node, shardID uint64, stored map[string]bool, stats *CreateStats) (*Part, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var skip []*shalev1.SnapshotFile
	prefix := fmt.Sprintf("files/shard-%d/", shardID)
	for path := range stored {
		if f, ok := parseStored(path, prefix); ok {
			skip = append(skip, f)
		}
	}
	until := time.Now().UTC()
	stream, err := cl.BackupShard(ctx, node, shardID, skip)
	if err != nil {
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("node %d: shard %d: %w", node, shardID, err)
	}
	hdr := first.GetHeader()
	if hdr == nil || hdr.GetShardId() != shardID {
		return nil, fmt.Errorf("%w: node %d: shard %d: the stream does not open with the shard's header", ErrCorrupt, node, shardID)
	}
	p, err := partOf(node, shardID, hdr, until)
	if err != nil {
		return nil, err
	}
	for i, f := range hdr.GetFiles() {
		path := p.Files[i].Path
		if stored[path] {
			stats.FilesSkipped++
			stats.BytesSkipped += int64(f.GetSize())
			continue
		}
		if err := receiveFile(ctx, stream, loc, uint32(i), f, path); err != nil {
			return nil, fmt.Errorf("node %d: shard %d: file %s: %w", node, shardID, f.GetName(), err)
		}
		stored[path] = true
		stats.FilesCopied++
		stats.BytesCopied += int64(f.GetSize())
	}
	if c, err := stream.Recv(); err != io.EOF {
		if err == nil {
			return nil, fmt.Errorf("%w: node %d: shard %d: data after the last file (file %d at %d)", ErrCorrupt, node, shardID, c.GetFileIndex(), c.GetOffset())
		}
		return nil, fmt.Errorf("node %d: shard %d: %w", node, shardID, err)
	}
	return p, nil
}

// partOf is the part of shard shardID that the checkpoint node describes
// in hdr (taken at until) holds, its files named where the location stores
// them.
func partOf(node, shardID uint64, hdr *shalev1.SnapshotHeader, until time.Time) (*Part, error) {
	if hdr.GetShardId() != shardID {
		return nil, fmt.Errorf("%w: node %d: shard %d: the checkpoint is of shard %d", ErrCorrupt, node, shardID, hdr.GetShardId())
	}
	var msg raftpb.Message
	if err := proto.Unmarshal(hdr.GetRaftMessage(), &msg); err != nil || msg.GetSnapshot().GetMetadata() == nil {
		return nil, fmt.Errorf("%w: node %d: shard %d: bad checkpoint metadata (%v)", ErrCorrupt, node, shardID, err)
	}
	if len(hdr.GetFiles()) > maxFiles {
		return nil, fmt.Errorf("%w: node %d: shard %d: %d files", ErrCorrupt, node, shardID, len(hdr.GetFiles()))
	}
	desc := hdr.GetDescriptor_()
	descJSON, err := protojson.Marshal(desc)
	if err != nil {
		return nil, fmt.Errorf("node %d: shard %d: %w", node, shardID, err)
	}
	meta := msg.GetSnapshot().GetMetadata()
	p := &Part{
		ShardID:      shardID,
		System:       desc.GetSystem(),
		Start:        desc.GetStartKey(),
		End:          desc.GetEndKey(),
		Epoch:        desc.GetEpoch(),
		Descriptor:   descJSON,
		NodeID:       node,
		AppliedIndex: meta.GetIndex(),
		AppliedTerm:  meta.GetTerm(),
		Date:         HLC{WallNanos: hdr.GetHlc().GetWallNanos(), Logical: hdr.GetHlc().GetLogical()},
		Until:        until,
	}
	for _, f := range hdr.GetFiles() {
		if err := validFileName(f.GetName()); err != nil {
			return nil, fmt.Errorf("%w: node %d: shard %d: %v", ErrCorrupt, node, shardID, err)
		}
		path := storedPath(shardID, f.GetName(), f.GetSize(), f.GetCrc32C())
		p.Files = append(p.Files, File{Name: f.GetName(), Size: f.GetSize(), CRC32C: f.GetCrc32C(), Path: path})
	}
	return p, nil
}

// errNodeCannotWrite says a node does not write its part into the
// location itself (nodeWriter.write): it is streamed through Create.
var errNodeCannotWrite = errors.New("the node does not write its part into the location")

// nodeWriter asks nodes to write their parts into the location
// themselves (Admin.BackupShardTo), and remembers those that cannot.
type nodeWriter struct {
	// req is the request's template, nil when every part goes through
	// Create (CreateOptions.ThroughClient).
	req *shalev1.BackupShardToRequest
	mu  sync.Mutex
	off map[uint64]bool // nodes that cannot
}

// write has node write its checkpoint of shard shardID into the location,
// but for the files stored holds, and returns the part; an error wrapping
// errNodeCannotWrite when the node does not implement it or cannot reach
// the location (then, and from then on, its parts are streamed).
func (w *nodeWriter) write(ctx context.Context, cl Cluster, node, shardID uint64, stored map[string]bool, stats *CreateStats) (*Part, error) {
	w.mu.Lock()
	off := w.req == nil || w.off[node]
	w.mu.Unlock()
	if off {
		return nil, errNodeCannotWrite
	}
	req := &shalev1.BackupShardToRequest{ShardId: shardID, Location: w.req.GetLocation(), BackupId: w.req.GetBackupId(),
		Token: w.req.GetToken(), S3Credentials: w.req.GetS3Credentials()}
	prefix := fmt.Sprintf("files/shard-%d/", shardID)
	for path := range stored {
		if f, ok := parseStored(path, prefix); ok {
			req.SkipFiles = append(req.SkipFiles, f)
		}
	}
	until := time.Now().UTC()
	resp, err := cl.BackupShardTo(ctx, node, req)
	if c := status.Code(err); c == codes.Unimplemented || c == codes.FailedPrecondition {
		w.mu.Lock()
		w.off[node] = true
		w.mu.Unlock()
		return nil, fmt.Errorf("node %d: %w: %w", node, errNodeCannotWrite, err)
	}
	if err != nil {
		return nil, err
	}
	hdr := resp.GetHeader()
	if len(hdr.GetFiles()) > maxFiles {
		return nil, fmt.Errorf("%w: node %d: shard %d: %d files", ErrCorrupt, node, shardID, len(hdr.GetFiles()))
	}
	p, err := partOf(node, shardID, hdr, until)
	if err != nil {
		return nil, err
	}
	wrote := make([]bool, len(p.Files))
	for _, i := range resp.GetWritten() {
		if int(i) >= len(p.Files) || wrote[i] {
			return nil, fmt.Errorf("%w: node %d: shard %d: wrote file %d of %d", ErrCorrupt, node, shardID, i, len(p.Files))
		}
		wrote[i] = true
	}
	for i, f := range p.Files {
		switch {
		case wrote[i]:
			stored[f.Path] = true
			stats.FilesCopied++
			stats.BytesCopied += int64(f.Size)
		case stored[f.Path]:
			stats.FilesSkipped++
			stats.BytesSkipped += int64(f.Size)
		default:
			return nil, fmt.Errorf("%w: node %d: shard %d: %s neither written nor already stored", ErrCorrupt, node, shardID, f.Path)
		}
	}
	stats.NodeWritten++
	return p, nil
}

// receiveFile stores file index of the stream at path (relative to the
// location), checking every chunk's and the whole file's checksum before
// the store sees the chunk: a damaged file is never stored.
func receiveFile(ctx context.Context, stream shalev1.Admin_BackupShardClient, loc *Location, index uint32, f *shalev1.SnapshotFile, path string) error {
	r := &fileReader{stream: stream, index: index, size: f.GetSize(), crc: f.GetCrc32C()}
	if r.size == 0 {
		if err := r.sum.check(0, r.crc); err != nil {
			return err
		}
	}
	return loc.st.put(ctx, path, r, int64(r.size))
}

// fileReader reads one file's chunks off a backup stream, checking each
// chunk's place and checksum, and the whole file's size and checksum when
// its last chunk arrives, before it yields that chunk.
type fileReader struct {
	stream  shalev1.Admin_BackupShardClient
	index   uint32
	size    uint64
	crc     uint32
	sum     crcCounter
	pending []byte
}

func (r *fileReader) Read(p []byte) (int, error) {
	if len(r.pending) == 0 {
		data, err := r.next()
		if err != nil {
			return 0, err
		}
		r.pending = data
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
}

// WriteTo writes the file's bytes to w chunk by chunk, each once checked,
// with no copy.
func (r *fileReader) WriteTo(w io.Writer) (int64, error) {
	var n int64
	for {
		data := r.pending
		r.pending = nil
		if len(data) == 0 {
			var err error
			if data, err = r.next(); err == io.EOF {
				return n, nil
			} else if err != nil {
				return n, err
			}
		}
		k, err := w.Write(data)
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
}

// next receives the file's next chunk and checks it (and, with its last
// chunk, the whole file); io.EOF once the file is complete.
func (r *fileReader) next() ([]byte, error) {
	if r.sum.n == r.size {
		return nil, io.EOF
	}
	c, err := r.stream.Recv()
	if err == io.EOF {
		return nil, fmt.Errorf("%w: the stream ended at byte %d of %d", ErrCorrupt, r.sum.n, r.size)
	}
	if err != nil {
		return nil, err
	}
	data := c.GetData()
	switch {
	case c.GetHeader() != nil || c.GetFileIndex() != r.index || c.GetOffset() != r.sum.n:
		return nil, fmt.Errorf("%w: chunk of file %d at %d, want file %d at %d", ErrCorrupt, c.GetFileIndex(), c.GetOffset(), r.index, r.sum.n)
	case len(data) == 0 || r.sum.n+uint64(len(data)) > r.size:
		return nil, fmt.Errorf("%w: chunk of %d bytes at %d of a %d-byte file", ErrCorrupt, len(data), r.sum.n, r.size)
	case crc32.Checksum(data, castagnoli) != c.GetCrc32C():
		return nil, fmt.Errorf("%w: chunk at %d: checksum mismatch", ErrCorrupt, r.sum.n)
	}
	_, _ = r.sum.Write(data)
	if r.sum.n == r.size {
		if err := r.sum.check(r.size, r.crc); err != nil {
			return nil, err
		}
	}
	return data, nil
}

// storedFiles lists the files stored in the location whose size matches
// their name (a file cut short is not taken for stored).
func (l *Location) storedFiles(ctx context.Context) (map[string]bool, error) {
	objs, err := l.st.list(ctx, "files/")
	if err != nil {
		return nil, fmt.Errorf("backup: list stored files: %w", err)
	}
	out := map[string]bool{}
	for _, o := range objs {
		dir := o.name[:strings.LastIndexByte(o.name, '/')+1]
		if f, ok := parseStored(o.name, dir); ok && uint64(o.size) == f.GetSize() {
			out[o.name] = true
		}
	}
	return out, nil
}

// parseStored reads name, size and checksum back from a stored path under
// prefix ("files/shard-N/").
func parseStored(path, prefix string) (*shalev1.SnapshotFile, bool) {
	if len(path) <= len(prefix) || path[:len(prefix)] != prefix {
		return nil, false
	}
	base := path[len(prefix):]
	var size uint64
	var crc uint32
	// <name>.<size>.<crc 8 hex digits>
	if len(base) < 12 || base[len(base)-9] != '.' {
		return nil, false
	}
	if _, err := fmt.Sscanf(base[len(base)-8:], "%08x", &crc); err != nil {
		return nil, false
	}
	rest := base[:len(base)-9]
	dot := bytes.LastIndexByte([]byte(rest), '.')
	if dot <= 0 {
		return nil, false
	}
	if _, err := fmt.Sscanf(rest[dot+1:], "%d", &size); err != nil {
		return nil, false
	}
	name := rest[:dot]
	var shard uint64
	if _, err := fmt.Sscanf(prefix, "files/shard-%d/", &shard); err != nil {
		return nil, false
	}
	if storedPath(shard, name, size, crc) != path {
		return nil, false
	}
	return &shalev1.SnapshotFile{Name: name, Size: size, Crc32C: crc}, true
}
