"""The client follows a shard split made after it cached its routing."""

from __future__ import annotations

import os
import time
from typing import List

import grpc

import shale
from tests.helpers import Wire
from shale.client import Target
from shale.v1 import admin_pb2, admin_pb2_grpc


def split(endpoints: List[str], key: bytes) -> None:
    """Split the shard holding key at key (Admin.SplitShard, any node), and
    wait until every node hosts a replica of the new shard."""
    with grpc.insecure_channel(endpoints[0]) as ch:
        resp = admin_pb2_grpc.AdminStub(ch).SplitShard(admin_pb2.SplitShardRequest(split_key=key), timeout=30)
    assert resp.left.end_key == key and resp.right.start_key == key
    for ep in endpoints:
        deadline = time.monotonic() + 20
        with grpc.insecure_channel(ep) as ch:
            while True:
                info = admin_pb2_grpc.AdminStub(ch).NodeInfo(admin_pb2.NodeInfoRequest(), timeout=5)
                if any(s.descriptor.shard_id == resp.right.shard_id for s in info.shards):
                    break
                assert time.monotonic() < deadline, f"{ep} hosts no replica of shard {resp.right.shard_id}"
                time.sleep(0.05)


def test_split_is_learnt_from_the_epoch_mismatch(client: shale.Client, endpoints: List[str], wire: Wire) -> None:
    # A split point of its own on every run, so that the test also runs
    # again on a cluster it split before; "rt-" keeps it out of the keys
    # other tests write in one transaction (test_scan's r0000 ... r0299).
    p = b"rt-" + os.urandom(4).hex().encode() + b"/"
    at = p + b"m"
    keys = [p + k for k in (b"a", b"f", b"m", b"r", b"z")]
    for k in keys:
        client.put(k, b"before")
    old, _ = client._rt.locate(Target(at))
    assert old is not None and old.contains(keys[0]) and old.contains(keys[-1])
    gen = client._rt.generation()

    split(endpoints, at)  # the client's cache still has the shard whole

    wire.calls.clear()
    client.put(keys[3], b"after")
    puts = wire.sent("PutRequest")
    # One refused for its epoch, then only the new shard (whose leader may
    # still be in election: NotLeader without a hint moves on to the next
    # replica after a backoff, until one names or is the leader).
    assert len(puts) >= 2
    assert puts[0].header.shard_id == old.id
    assert {q.header.shard_id for q in puts[1:]} == {puts[-1].header.shard_id} != {old.id}
    # The EpochMismatch carries the shard's new range and the new shard
    # (every node hosts it by now): no GetRouting is needed.
    assert wire.sent("GetRoutingRequest") == []
    assert client._rt.generation() == gen
    left, _ = client._rt.locate(Target(keys[1]))
    right, _ = client._rt.locate(Target(keys[3]))
    assert left is not None and right is not None
    assert (left.desc.start_key, left.desc.end_key) == (old.desc.start_key, at) and left.epoch > old.epoch
    assert (right.desc.start_key, right.desc.end_key) == (at, old.desc.end_key)

    # Every call works across the new boundary.
    got = client.multi_get(keys)
    assert [kv.value if kv else None for kv in got] == [b"before"] * 3 + [b"after", b"before"]
    assert [kv.key for kv in client.scan(prefix=p)] == keys
    assert [kv.key for kv in client.scan(prefix=p, reverse=True, page_size=1)] == keys[::-1]
    r = client.txn().compare(shale.Value(keys[3]) == b"after").then(shale.Put(keys[4], b"txn")).commit()
    assert r.succeeded
    client.delete_range(keys[1], keys[4])
    assert [kv.key for kv in client.scan(prefix=p)] == [keys[0], keys[4]]

    # A new client learns the split from GetRouting.
    with shale.Client(endpoints) as fresh:
        got = fresh.multi_get([keys[0], keys[4]])
        assert [kv.value if kv else None for kv in got] == [b"before", b"txn"]
