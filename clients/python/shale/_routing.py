"""The client's routing cache: shard descriptors sorted by start key, each
with its last known leader, and node addresses (the Go SDK's client/routing.go)."""

from __future__ import annotations

import bisect
import threading
import time
from typing import Dict, List, Optional, Tuple

from shale.v1 import admin_pb2, meta_pb2


def contains_key(d: meta_pb2.ShardDescriptor, key: bytes) -> bool:
    """Whether key is in the shard's range."""
    return d.start_key <= key and (not d.end_key or key < d.end_key)


def contains_before(d: meta_pb2.ShardDescriptor, end: bytes) -> bool:
    """Whether the keys just below end (exclusive; b"" is the end of the key
    space) are in the shard."""
    if not end:
        return not d.end_key
    return d.start_key < end and (not d.end_key or end <= d.end_key)


def overlaps(a: meta_pb2.ShardDescriptor, b: meta_pb2.ShardDescriptor) -> bool:
    """Whether two shard ranges intersect."""
    a_before_b_end = not b.end_key or a.start_key < b.end_key
    b_before_a_end = not a.end_key or b.start_key < a.end_key
    return a_before_b_end and b_before_a_end


def is_voter(r: meta_pb2.ReplicaDescriptor) -> bool:
    """Whether a replica votes (and so may lead)."""
    return r.role != meta_pb2.REPLICA_ROLE_LEARNER


class Shard:
    """One cached shard: an immutable descriptor and the leader last seen (0: unknown)."""

    __slots__ = ("desc", "leader")

    def __init__(self, desc: meta_pb2.ShardDescriptor, leader: int = 0) -> None:
        self.desc = desc
        self.leader = leader

    @property
    def id(self) -> int:
        return int(self.desc.shard_id)

    @property
    def epoch(self) -> int:
        return int(self.desc.epoch)

    def contains(self, key: bytes) -> bool:
        return contains_key(self.desc, key)


class Target:
    """Which shard a request goes to: the one holding key, or (before) the one
    holding the keys just below key, an exclusive end where b"" is the end of
    the key space."""

    __slots__ = ("key", "before")

    def __init__(self, key: bytes, before: bool = False) -> None:
        self.key = key
        self.before = before

    def within(self, d: meta_pb2.ShardDescriptor) -> bool:
        return contains_before(d, self.key) if self.before else contains_key(d, self.key)


class Routing:
    """The routing cache. Thread-safe."""

    def __init__(self) -> None:
        self.mu = threading.RLock()
        self.shards: List[Shard] = []  # sorted by start key, non-overlapping
        self.starts: List[bytes] = []
        self.by_id: Dict[int, Shard] = {}
        self.nodes: Dict[int, str] = {}
        self.cluster_id = ""
        self.gen = 0  # bumped by every full refresh
        self.last_good = ""  # the address that answered the last GetRouting
        self.refreshed = 0.0  # monotonic time of the last full refresh

    def generation(self) -> int:
        with self.mu:
            return self.gen

    def _reindex(self) -> None:
        self.starts = [s.desc.start_key for s in self.shards]

    def locate(self, t: Target) -> Tuple[Optional[Shard], int]:
        """The cached shard of t (None when the cache has none) and the generation it was found in."""
        with self.mu:
            if t.before:
                if not t.key:
                    i = len(self.shards) - 1
                else:
                    i = bisect.bisect_left(self.starts, t.key) - 1  # last start strictly below key
            else:
                i = bisect.bisect_right(self.starts, t.key) - 1  # last start at or below key
            if i < 0 or i >= len(self.shards) or not t.within(self.shards[i].desc):
                return None, self.gen
            return self.shards[i], self.gen

    def shard(self, shard_id: int) -> Optional[Shard]:
        with self.mu:
            return self.by_id.get(shard_id)

    def addr(self, node: int) -> str:
        with self.mu:
            return self.nodes.get(node, "")

    def set_addr(self, node: int, addr: str) -> None:
        """Record a node's address learnt from a leader hint."""
        if node and addr:
            with self.mu:
                self.nodes[node] = addr

    def set_leader(self, shard_id: int, node: int) -> None:
        with self.mu:
            s = self.by_id.get(shard_id)
            if s is not None:
                s.leader = node

    @staticmethod
    def clear_leader(s: Shard, node: int) -> None:
        """Forget node as the shard's leader (when it failed)."""
        if s.leader == node:
            s.leader = 0

    def apply(self, d: Optional[meta_pb2.ShardDescriptor]) -> bool:
        """Install a descriptor learnt from an EpochMismatch: it replaces the
        cached shard with the same ID, when older, and every cached shard
        overlapping its range. False (and no change) when the cache already
        has that shard at the same or a newer epoch."""
        if d is None or d.system or not d.shard_id:
            return False
        with self.mu:
            leader = 0
            old = self.by_id.get(d.shard_id)
            if old is not None:
                if old.epoch >= d.epoch:
                    return False
                leader = old.leader
            nd = meta_pb2.ShardDescriptor()
            nd.CopyFrom(d)
            ns = Shard(nd)
            for rep in d.replicas:
                if rep.node_id == leader and is_voter(rep):
                    ns.leader = leader
            kept = []
            for s in self.shards:
                if s.id == d.shard_id or overlaps(s.desc, d):
                    self.by_id.pop(s.id, None)
                    continue
                kept.append(s)
            i = bisect.bisect_right([s.desc.start_key for s in kept], d.start_key)
            kept.insert(i, ns)
            self.shards = kept
            self.by_id[ns.id] = ns
            self._reindex()
            return True

    def replace(self, resp: admin_pb2.GetRoutingResponse, src: str) -> None:
        """Install a full routing table from GetRouting."""
        shards = []
        for rs in resp.shards:
            d = rs.descriptor
            if not rs.HasField("descriptor") or d.system:
                continue
            shards.append(Shard(d, rs.leader_node_id))
        shards.sort(key=lambda s: s.desc.start_key)
        nodes = {n.node_id: n.address for n in resp.nodes if n.address}
        with self.mu:
            self.shards = shards
            self.by_id = {s.id: s for s in shards}
            self.nodes = nodes
            self.cluster_id = resp.cluster_id
            self.gen += 1
            self.last_good = src
            self.refreshed = time.monotonic()
            self._reindex()

    def snapshot(self) -> Tuple[List[Tuple[meta_pb2.ShardDescriptor, int]], Dict[int, str]]:
        """A copy of the table: (descriptor, leader) per shard, and the node addresses."""
        with self.mu:
            return [(s.desc, s.leader) for s in self.shards], dict(self.nodes)
