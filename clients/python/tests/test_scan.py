"""Scans across the cluster's shards (initial splits g, n, t, and any other
split made since), forward and reverse, with limits, prefixes and pages."""

from __future__ import annotations

import bisect
import itertools
import os
from typing import List

import pytest

import shale
from tests.helpers import Wire, split_shard

PER_LETTER = 300  # [a, g) then holds 1,800 keys: more than a server page (1,000)


@pytest.fixture
def keys(client: shale.Client) -> List[bytes]:
    """7,800 keys, a0000 ... z0299, written by one transaction per letter."""
    out = []
    for c in range(ord("a"), ord("z") + 1):
        ks = [b"%c%04d" % (c, i) for i in range(PER_LETTER)]
        put_in_transactions(client, ks)
        out.extend(ks)
    return out


def put_in_transactions(client: shale.Client, ks: List[bytes]) -> None:
    """Write the sorted keys ks (value b"v-" + key) in one transaction, or
    in one per shard where a split made since (another test's) lies
    between them: a transaction refused as CrossShard wrote nothing, so
    each key is written once."""
    try:
        client.txn().then(*(shale.Put(k, b"v-" + k) for k in ks)).commit()
    except shale.CrossShard as e:
        i = bisect.bisect_left(ks, e.split_key)
        if i == 0 or i == len(ks):
            raise
        put_in_transactions(client, ks[:i])
        put_in_transactions(client, ks[i:])


def test_keys_written_across_a_split(client: shale.Client) -> None:
    """The fixture's writer meets a split between its keys (as test_routing's
    random split points once did between r0044 and r0045): each key is
    written once, by one transaction per side."""
    p = b"qs-" + os.urandom(4).hex().encode() + b"/"
    ks = [p + b"%04d" % i for i in range(PER_LETTER)]
    split_shard(client, ks[PER_LETTER // 2] + b"-")
    with pytest.raises(shale.CrossShard):
        client.txn().then(*(shale.Put(k, b"x") for k in ks)).commit()
    put_in_transactions(client, ks)
    got = list(client.scan(prefix=p))
    assert [kv.key for kv in got] == ks
    assert all(kv.value == b"v-" + kv.key and kv.version == 1 for kv in got)


def test_scan_every_key_in_order(client: shale.Client, keys: List[bytes], wire: Wire) -> None:
    shards, _ = client.routing()
    assert len(shards) >= 4, "the cluster should have its initial splits g, n, t"
    wire.calls.clear()
    got = list(client.scan())
    assert [kv.key for kv in got] == keys
    assert all(kv.value == b"v-" + kv.key and kv.version == 1 for kv in got)
    # One page per shard at least, and more for the shards over a page.
    assert len(wire.sent("ScanRequest")) >= len(shards) + 1
    assert [kv.key for kv in client.scan(reverse=True)] == keys[::-1]


def test_scan_ranges_limits_and_prefixes(client: shale.Client, keys: List[bytes]) -> None:
    lo, hi = b"f0150", b"u0010"
    want = [k for k in keys if lo <= k < hi]
    assert [kv.key for kv in client.scan(lo, hi)] == want
    assert [kv.key for kv in client.scan(lo, hi, reverse=True)] == want[::-1]
    for limit in (1, 10, 1000, 1500, 5000):
        assert [kv.key for kv in client.scan(lo, hi, limit=limit)] == want[:limit]
        assert [kv.key for kv in client.scan(lo, hi, limit=limit, reverse=True)] == want[::-1][:limit]
    assert [kv.key for kv in client.scan(limit=2000)] == keys[:2000]
    assert [kv.key for kv in client.scan(reverse=True, limit=2000)] == keys[::-1][:2000]
    assert [kv.key for kv in client.scan(prefix=b"h")] == [k for k in keys if k.startswith(b"h")]
    assert [kv.key for kv in client.scan(prefix=b"m02", reverse=True)] == [
        k for k in keys if k.startswith(b"m02")][::-1]
    assert [kv.key for kv in client.scan(prefix="t0299")] == [b"t0299"]
    assert list(client.scan(prefix=b"nothing")) == []
    assert list(client.scan(b"zz")) == []
    assert [kv.key for kv in client.scan(None, b"a0003")] == keys[:3]
    assert [kv.key for kv in client.scan(b"z0297", None)] == keys[-3:]


def test_scan_pages_across_a_boundary(client: shale.Client, keys: List[bytes], wire: Wire) -> None:
    lo, hi = b"f0290", b"g0020"  # crosses the split at g
    want = [k for k in keys if lo <= k < hi]
    wire.calls.clear()
    assert [kv.key for kv in client.scan(lo, hi, page_size=7)] == want
    pages = wire.sent("ScanRequest")
    assert len(pages) >= len(want) // 7
    assert all(0 < p.limit <= 7 for p in pages)
    assert [kv.key for kv in client.scan(lo, hi, page_size=7, reverse=True, limit=25)] == want[::-1][:25]
    assert [kv.key for kv in client.scan(lo, hi, page_size=3, limit=4)] == want[:4]


def test_scan_keys_only(client: shale.Client, keys: List[bytes]) -> None:
    got = list(client.scan(prefix=b"c", keys_only=True))
    assert [kv.key for kv in got] == [k for k in keys if k.startswith(b"c")]
    assert all(kv.value == b"" and kv.mod_revision > 0 for kv in got)


def test_scan_is_lazy(client: shale.Client, keys: List[bytes], wire: Wire) -> None:
    wire.calls.clear()
    it = client.scan()
    assert wire.sent("ScanRequest") == [], "nothing is fetched before the first next()"
    first = list(itertools.islice(it, 5))
    assert [kv.key for kv in first] == keys[:5]
    # One page holds the first keys. A retry of that page (the same shard,
    # start and continuation, e.g. after its leader moved while the suite's
    # other tests restart nodes) is the same page; a second page is not.
    pages = {(r.header.shard_id, r.start_key, r.continuation_token) for r in wire.sent("ScanRequest")}
    assert len(pages) == 1, "one page holds the first keys"
    it.close()  # a generator: close() (or dropping it) ends the scan
    assert list(it) == []
