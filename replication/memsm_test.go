package replication

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// memSM is a test state machine: a string map whose whole state is written
// to dir/state.json after every Apply (tests keep it small). Payloads are
// "key=value" commands; Apply returns each command's place: its entry's
// index and its part (Entry.Part), as a [2]uint64.
type memSM struct {
	dir string

	mu       sync.Mutex
	st       AppliedState
	data     map[string]string
	restores int
	// packedParts counts the commands applied from packed entries.
	packedParts int
	// applyErr, when set, fails every Apply (a test's injected fault).
	applyErr error
}

type memSMFile struct {
	Index, Term uint64
	ConfState   []byte
	Descriptor  []byte
	Data        map[string]string
}

func newMemSM(dir string, st AppliedState) (*memSM, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	m := &memSM{dir: dir, st: st, data: map[string]string{}}
	if st.Index > 0 {
		if err := m.save(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func openMemSM(dir string) (*memSM, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	m := &memSM{dir: dir, data: map[string]string{}}
	err := m.load(filepath.Join(dir, "state.json"))
	if os.IsNotExist(err) {
		return m, nil
	}
	return m, err
}

func (m *memSM) load(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var f memSMFile
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	cs := &raftpb.ConfState{}
	if err := proto.Unmarshal(f.ConfState, cs); err != nil {
		return err
	}
	desc := &shalev1.ShardDescriptor{}
	if err := proto.Unmarshal(f.Descriptor, desc); err != nil {
		return err
	}
	m.st = AppliedState{Index: f.Index, Term: f.Term, ConfState: cs, Descriptor: desc}
	m.data = f.Data
	if m.data == nil {
		m.data = map[string]string{}
	}
	return nil
}

func (m *memSM) encode() ([]byte, error) {
	cs, err := proto.Marshal(m.st.ConfState)
	if err != nil {
		return nil, err
	}
	desc, err := proto.Marshal(m.st.Descriptor)
	if err != nil {
		return nil, err
	}
	return json.Marshal(memSMFile{Index: m.st.Index, Term: m.st.Term, ConfState: cs, Descriptor: desc, Data: m.data})
}

func (m *memSM) save() error {
	b, err := m.encode()
	if err != nil {
		return err
	}
	tmp := filepath.Join(m.dir, "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(m.dir, "state.json"))
}

func (m *memSM) AppliedState() AppliedState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st
}

func (m *memSM) AppliedDescriptor() *shalev1.ShardDescriptor {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Descriptor
}

func (m *memSM) Apply(ents []Entry) (Applied, error) {
	res, err := m.apply(ents)
	return Applied{Results: res}, err
}

func (m *memSM) apply(ents []Entry) ([]any, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.applyErr != nil {
		return nil, m.applyErr
	}
	res := make([]any, len(ents))
	for i, e := range ents {
		if e.Part > 0 {
			// A later command of a packed entry.
			if e.Index != m.st.Index || e.Parts < 2 || e.Part >= e.Parts {
				return nil, fmt.Errorf("memSM: part %d of %d of entry %d at %d", e.Part, e.Parts, e.Index, m.st.Index)
			}
		} else if e.Index <= m.st.Index {
			return nil, fmt.Errorf("memSM: entry %d applied twice (at %d)", e.Index, m.st.Index)
		} else if e.Index != m.st.Index+1 && m.st.Index != 0 {
			return nil, fmt.Errorf("memSM: gap: entry %d after %d", e.Index, m.st.Index)
		}
		m.st.Index, m.st.Term = e.Index, e.Term
		if e.Parts > 0 {
			m.packedParts++
		}
		if cc := e.ConfChange; cc != nil {
			m.st.ConfState = cc.ConfState
			desc := proto.Clone(m.st.Descriptor).(*shalev1.ShardDescriptor)
			nodes := map[uint64]uint64{}
			for _, r := range desc.GetReplicas() {
				nodes[r.GetReplicaId()] = r.GetNodeId()
			}
			for _, r := range cc.Context.GetReplicas() {
				nodes[r.GetReplicaId()] = r.GetNodeId()
				desc.NextReplicaId = max(desc.NextReplicaId, r.GetReplicaId()+1)
			}
			desc.Replicas = nil
			add := func(ids []uint64, role shalev1.ReplicaRole) {
				for _, id := range ids {
					desc.Replicas = append(desc.Replicas, &shalev1.ReplicaDescriptor{NodeId: nodes[id], ReplicaId: id, Role: role})
				}
			}
			add(cc.ConfState.GetVoters(), shalev1.ReplicaRole_REPLICA_ROLE_VOTER_UNSPECIFIED)
			add(cc.ConfState.GetLearners(), shalev1.ReplicaRole_REPLICA_ROLE_LEARNER)
			for _, id := range cc.ConfState.GetVotersOutgoing() {
				found := false
				for _, v := range cc.ConfState.GetVoters() {
					found = found || v == id
				}
				if !found {
					add([]uint64{id}, shalev1.ReplicaRole_REPLICA_ROLE_VOTER_OUTGOING)
				}
			}
			desc.Epoch++
			m.st.Descriptor = desc
			continue
		}
		if e.Payload == nil {
			continue
		}
		k, v, ok := strings.Cut(string(e.Payload), "=")
		if !ok {
			return nil, fmt.Errorf("memSM: bad payload %q", e.Payload)
		}
		m.data[k] = v
		res[i] = [2]uint64{e.Index, uint64(e.Part)}
	}
	return res, m.save()
}

func (m *memSM) Flush() (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Index, nil
}

func (m *memSM) Checkpoint(dir string) (AppliedState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return AppliedState{}, err
	}
	b, err := m.encode()
	if err != nil {
		return AppliedState{}, err
	}
	return m.st, os.WriteFile(filepath.Join(dir, "state.json"), b, 0o644)
}

func (m *memSM) Restore(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	defer os.RemoveAll(dir)
	if err := m.load(filepath.Join(dir, "state.json")); err != nil {
		return err
	}
	m.restores++
	return m.save()
}

func (m *memSM) Close() error { return nil }

func (m *memSM) get(k string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.data[k]
	return v, ok
}

func (m *memSM) dump() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := make([]string, 0, len(m.data))
	for k := range m.data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "%s=%s;", k, m.data[k])
	}
	return sb.String()
}
