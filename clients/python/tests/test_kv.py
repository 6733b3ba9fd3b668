"""Every call of shale.Client against a real 3-node cluster."""

from __future__ import annotations

import datetime
import time
from typing import List

import pytest

import shale
from shale.v1 import admin_pb2


def test_put_get_delete(client: shale.Client) -> None:
    assert client.get(b"k1") is None
    r1 = client.put(b"k1", b"v1")
    assert r1.revision > 0 and r1.prev_kv is None
    kv = client.get(b"k1")
    assert kv is not None
    assert (kv.key, kv.value, kv.version) == (b"k1", b"v1", 1)
    assert kv.create_revision == kv.mod_revision == r1.revision
    assert kv.expire_at is None

    r2 = client.put(b"k1", b"v2", prev_kv=True)
    assert r2.revision > r1.revision
    assert r2.prev_kv is not None and r2.prev_kv.value == b"v1" and r2.prev_kv.version == 1
    kv = client.get(b"k1")
    assert kv is not None and (kv.value, kv.version, kv.create_revision, kv.mod_revision) == (
        b"v2", 2, r1.revision, r2.revision)

    d = client.delete(b"k1", prev_kv=True)
    assert d.deleted and d.revision > r2.revision
    assert d.prev_kv is not None and d.prev_kv.value == b"v2"
    assert client.get(b"k1") is None
    again = client.delete(b"k1")
    assert not again.deleted and again.prev_kv is None


def test_get_must_exist_raises_not_found(client: shale.Client) -> None:
    with pytest.raises(shale.NotFound) as ei:
        client.get(b"absent", must_exist=True)
    assert isinstance(ei.value, KeyError) and ei.value.key == b"absent"
    client.put(b"present", b"")
    kv = client.get(b"present", must_exist=True)
    assert kv is not None and kv.value == b""


def test_str_keys_and_values_are_utf8(client: shale.Client) -> None:
    client.put("clé", "välue")
    kv = client.get("clé".encode())
    assert kv is not None and kv.key == "clé".encode() and kv.value == "välue".encode()
    client.put(bytearray(b"ba"), memoryview(b"mv"))
    kv = client.get(b"ba")
    assert kv is not None and kv.value == b"mv"
    with pytest.raises(TypeError):
        client.put(42, b"x")  # type: ignore[arg-type]


def test_read_consistencies(client: shale.Client) -> None:
    client.put(b"c", b"1")
    for c in (shale.Consistency.LINEARIZABLE, shale.Consistency.FOLLOWER):
        kv = client.get(b"c", consistency=c)
        assert kv is not None and kv.value == b"1"
    # A stale read may lag, but the key eventually shows on every replica.
    deadline = time.monotonic() + 5
    while True:
        kv = client.get(b"c", consistency=shale.Consistency.STALE)
        if kv is not None or time.monotonic() > deadline:
            break
    assert kv is not None and kv.value == b"1"
    with pytest.raises(shale.InvalidArgument):
        client.get(b"c", consistency="eventual")


def test_ttl(client: shale.Client) -> None:
    before = datetime.datetime.now(datetime.timezone.utc)
    client.put(b"ttl", b"v", ttl=1.0)
    kv = client.get(b"ttl")
    assert kv is not None and kv.expire_at is not None
    assert before < kv.expire_at < before + datetime.timedelta(seconds=10)
    client.put(b"ttl-td", b"v", ttl=datetime.timedelta(milliseconds=800))
    time.sleep(1.5)
    assert client.get(b"ttl") is None
    assert client.get(b"ttl-td") is None
    # A put without TTL clears an earlier one.
    client.put(b"ttl2", b"v", ttl=60)
    client.put(b"ttl2", b"w")
    kv = client.get(b"ttl2")
    assert kv is not None and kv.expire_at is None


def test_multi_get_across_shards(client: shale.Client) -> None:
    keys = [b"a1", b"h1", b"o1", b"u1", b"a2"]  # the shards of the splits g, n, t
    for k in keys[:4]:
        client.put(k, b"v-" + k)
    got = client.multi_get(keys + [b"h1", b"zz"])
    assert [kv.value if kv else None for kv in got] == [
        b"v-a1", b"v-h1", b"v-o1", b"v-u1", None, b"v-h1", None]
    assert client.multi_get([]) == []


def test_delete_range_across_shards(client: shale.Client) -> None:
    keys = [bytes([c]) + b"/k" for c in range(ord("a"), ord("z") + 1)]
    for k in keys:
        client.put(k, b"v")
    client.delete_range(b"c", b"v")  # crosses g, n and t
    left = [kv.key for kv in client.scan()]
    assert left == [k for k in keys if not b"c" <= k < b"v"]
    client.delete_range(b"u", None)  # to the end of the key space
    assert [kv.key for kv in client.scan()] == [b"a/k", b"b/k"]
    client.delete_range(None, None)
    assert list(client.scan()) == []


def test_cas(client: shale.Client) -> None:
    r = client.cas(b"lock", None, b"me")  # create if absent
    assert r.succeeded and bool(r) and r.current is None
    r = client.cas(b"lock", None, b"you")
    assert not r.succeeded and not r and r.current is not None and r.current.value == b"me"
    r = client.cas(b"lock", b"me", b"you")
    assert r.succeeded and r.current is not None and r.current.value == b"me"
    kv = client.get(b"lock")
    assert kv is not None and kv.value == b"you" and kv.version == 2
    with pytest.raises(shale.CompareFailed) as ei:
        client.cas(b"lock", b"me", b"again", must_succeed=True)
    cur = ei.value.current
    assert isinstance(cur, shale.KeyValue) and cur.value == b"you"
    kv = client.get(b"lock")
    assert kv is not None and kv.value == b"you" and kv.version == 2  # a failed swap writes nothing
    r = client.cas(b"lock", b"you", b"tmp", ttl=0.5)
    assert r.succeeded
    time.sleep(1.2)
    assert client.get(b"lock") is None


def test_txn(client: shale.Client) -> None:
    client.put(b"acct/1", b"100")
    r = (client.txn()
         .compare(shale.Value(b"acct/1") == b"100", shale.key_missing(b"acct/hold"))
         .then(shale.Put(b"acct/1", b"90"), shale.Put(b"acct/log", b"-10", prev_kv=True), shale.Get(b"acct/1"))
         .else_(shale.Get(b"acct/1"))
         .commit())
    assert r.succeeded and bool(r) and r.revision > 0
    assert [x.type for x in r.results] == ["put", "put", "get"]
    assert r.results[1].prev_kv is None
    assert r.results[2].kv is not None and r.results[2].kv.value == b"90"

    # The same comparison fails now: the else branch runs.
    r = (client.txn()
         .compare(shale.Value(b"acct/1") == b"100")
         .then(shale.Put(b"acct/1", b"80"))
         .else_(shale.Get(b"acct/1"), shale.Delete(b"acct/log", prev_kv=True))
         .commit())
    assert not r.succeeded
    assert [x.type for x in r.results] == ["get", "delete"]
    assert r.results[0].kv is not None and r.results[0].kv.value == b"90"
    assert r.results[1].deleted and r.results[1].prev_kv is not None and r.results[1].prev_kv.value == b"-10"
    assert client.get(b"acct/log") is None

    # Numeric comparisons and a range delete.
    for i in range(3):
        client.put(b"acct/x%d" % i, b"v")
    r = (client.txn()
         .compare(shale.Version(b"acct/1") == 2, shale.ModRevision(b"acct/1") > 0,
                  shale.CreateRevision(b"acct/1") < 1 << 40, shale.Exists(b"acct/1") == 1,
                  shale.key_exists(b"acct/x0"), shale.Value(b"acct/1") != b"100")
         .then(shale.DeleteRange(b"acct/x", b"acct/y"))
         .commit())
    assert r.succeeded and [x.type for x in r.results] == ["delete_range"]
    assert [kv.key for kv in client.scan(prefix=b"acct/")] == [b"acct/1"]
    r = client.txn().compare(shale.Version(b"acct/1") > 5).commit()
    assert not r.succeeded and r.results == []


def test_txn_across_shards_is_refused_before_sending(client: shale.Client, wire) -> None:  # type: ignore[no-untyped-def]
    wire.calls.clear()
    with pytest.raises(shale.CrossShard) as ei:
        client.txn().compare(shale.Value(b"a") == b"x").then(shale.Put(b"z", b"1")).commit()
    assert isinstance(ei.value, shale.InvalidArgument)
    assert ei.value.split_key == b"g"
    assert wire.sent("TxnRequest") == []
    assert client.get(b"z") is None


def test_cluster_status(client: shale.Client) -> None:
    st = client.cluster_status()
    assert isinstance(st, admin_pb2.ClusterStatusResponse)
    assert st.cluster_id
    assert len(st.nodes) == 3 and all(n.live for n in st.nodes)
    user = [s for s in st.shards if not s.descriptor.system]
    assert len(user) >= 4, [s.descriptor for s in user]
    assert all(s.leader_node_id for s in st.shards)
    starts = sorted(s.descriptor.start_key for s in user)
    for split in (b"g", b"n", b"t"):
        assert split in starts


def test_routing_learned_from_any_node(endpoints: List[str]) -> None:
    # One endpoint is enough: the client learns the others from it.
    for ep in endpoints:
        with shale.Client([ep]) as c:
            shards, nodes = c.routing()
            assert sorted(nodes.values()) == sorted(endpoints)
            assert [d.start_key for d, _ in shards][:1] == [b""]
            assert all(leader for _, leader in shards)
            c.put(b"via-" + ep.encode(), b"x")
    with shale.Client(endpoints) as c:
        assert len(list(c.scan(prefix=b"via-"))) == len(endpoints)


def test_context_manager_closes(endpoints: List[str]) -> None:
    with shale.Client(",".join(endpoints)) as c:
        c.put(b"cm", b"1")
    with pytest.raises(shale.ClientClosed):
        c.get(b"cm")
    c.close()  # idempotent


def test_connect_errors() -> None:
    with pytest.raises(shale.InvalidArgument):
        shale.Client([])
    with pytest.raises(shale.InvalidArgument, match="no port"):
        shale.Client(["127.0.0.1"])
    t0 = time.monotonic()
    with pytest.raises(shale.Unavailable, match="connection refused") as ei:
        shale.Client(["127.0.0.1:1"], timeout=30)
    assert not isinstance(ei.value, shale.DeadlineExceeded)
    assert time.monotonic() - t0 < 10  # gives up after 2 s of refusals, not at the deadline
