"""shale.aio.Client against a real cluster: every call, concurrent awaits
applied once each, the async scan and watch, errors as the sync client's.
Coroutines run with asyncio.run (Debian's pytest has no asyncio plugin)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, List, Tuple

import pytest

import shale
import shale.aio
from tests.helpers import Wire, split_shard


def run(endpoints: List[str], body: Callable[[shale.aio.Client], Awaitable[Any]]) -> Any:
    """Run body with a connected asyncio client on an empty cluster."""

    async def main() -> Any:
        async with shale.aio.Client(endpoints) as c:
            await c.delete_range(None, None)
            return await body(c)

    return asyncio.run(main())


def test_every_call(endpoints: List[str]) -> None:
    async def body(c: shale.aio.Client) -> None:
        assert await c.get(b"a") is None
        with pytest.raises(shale.NotFound):
            await c.get(b"a", must_exist=True)
        r = await c.put(b"a", b"1")
        assert r.revision > 0 and r.prev_kv is None
        r2 = await c.put(b"a", b"2", prev_kv=True, ttl=60)
        assert r2.prev_kv is not None and r2.prev_kv.value == b"1"
        kv = await c.get(b"a", consistency=shale.Consistency.STALE)
        assert kv is not None and kv.value == b"2" and kv.version == 2 and kv.expire_at is not None
        for k in (b"h", b"o", b"u"):  # one key per shard
            await c.put(k, k)
        assert [kv and kv.value for kv in await c.multi_get([b"u", b"a", b"zz", b"h"])] == [b"u", b"2", None, b"h"]
        d = await c.delete(b"a", prev_kv=True)
        assert d.deleted and d.prev_kv is not None and d.prev_kv.value == b"2"
        assert not (await c.delete(b"a")).deleted
        assert [kv.key async for kv in c.scan()] == [b"h", b"o", b"u"]
        assert [kv.key async for kv in c.scan(reverse=True, limit=2)] == [b"u", b"o"]
        assert [kv.key async for kv in c.scan(prefix=b"o")] == [b"o"]
        cas = await c.cas(b"h", b"h", b"H")
        assert cas.succeeded and cas.current is not None and cas.current.value == b"h"
        assert not (await c.cas(b"h", b"x", b"y")).succeeded
        with pytest.raises(shale.CompareFailed):
            await c.cas(b"new", b"x", b"y", must_succeed=True)
        assert (await c.cas(b"new", None, b"created")).succeeded
        t = await (
            c.txn()
            .compare(shale.Value(b"h") == b"H")
            .then(shale.Put(b"h2", b"x"), shale.Get(b"h"))
            .else_(shale.Get(b"h"))
            .commit()
        )
        assert t.succeeded and t.results[1].kv is not None and t.results[1].kv.value == b"H"
        with pytest.raises(shale.CrossShard):
            await c.txn().then(shale.Put(b"a", b"1"), shale.Put(b"z", b"1")).commit()
        await c.delete_range(b"h", b"p")
        assert [kv.key async for kv in c.scan()] == [b"u"]  # new, h, h2 and o were in [h, p)
        st = await c.cluster_status()
        assert len(st.nodes) == 3 and len(st.shards) >= 4
        shards, nodes = c.routing()
        assert len(nodes) == 3 and len(shards) >= 4

    run(endpoints, body)


def test_bad_input_at_once(endpoints: List[str]) -> None:
    async def body(c: shale.aio.Client) -> None:
        with pytest.raises(shale.InvalidArgument):
            await c.put(b"", b"v")
        with pytest.raises(shale.InvalidArgument):
            c.scan(b"b", b"a")
        with pytest.raises(shale.InvalidArgument):
            await c.delete_range(b"b", b"a")
        with pytest.raises(shale.InvalidArgument):
            c.watch(b"b", b"a")
        with pytest.raises(shale.InvalidArgument):
            await c.put(b"k", b"v", ttl=-1)

    run(endpoints, body)


def test_concurrent_puts_apply_once_each(endpoints: List[str], wire: Wire, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(c: shale.aio.Client) -> None:
        n = 200
        t0 = time.monotonic()
        # Keys in every shard (g..., and n..., t... and a... below).
        keys = [b"%c%03d" % (b"agnt"[i % 4], i) for i in range(n)]
        res = await asyncio.gather(*(c.put(k, b"%d" % i) for i, k in enumerate(keys)))
        took = time.monotonic() - t0
        assert len(res) == n and all(r.revision > 0 for r in res)
        kvs = [kv async for kv in c.scan()]
        assert len(kvs) == n
        assert all(kv.version == 1 for kv in kvs), "a put applied twice"
        assert sorted(int(kv.value) for kv in kvs) == list(range(n))
        ids = [r.header.request_id for r in wire.sent("PutRequest")]
        assert len(ids) >= n and len(set(ids)) == n, "one request ID per put, reused only by its retries"
        assert took < 30, took

    # The Wire fixture records the sync client's _send; the asyncio
    # client's is its own: record it the same way.
    real = shale.aio.Client._send

    async def send(self: shale.aio.Client, method: Any, request: Any, timeout: Any, md: Any) -> Any:
        wire.calls.append((type(request).__name__, request, dict(md or [])))
        return await real(self, method, request, timeout, md)

    monkeypatch.setattr(shale.aio.Client, "_send", send)
    run(endpoints, body)


def test_watch_async_across_a_split(endpoints: List[str]) -> None:
    async def body(c: shale.aio.Client) -> None:
        pre = b"xw/%d/" % time.monotonic_ns()  # in the last shard: other tests expect the splits g, n, t first
        async with c.watch(prefix=pre, prev_kv=True) as w:
            assert await w.wait_started(30)
            written = []
            for i in range(60):
                if i == 30:
                    await asyncio.to_thread(split_shard_sync, endpoints, pre + b"m")
                k = pre + (b"a%d" % i if i % 2 else b"z%d" % i)
                written.append((k, (await c.put(k, b"v")).revision))
            d = await c.delete(pre + b"a1")
            written.append((pre + b"a1", d.revision))
            got = []
            deletes = []
            async for ev in w.events():
                got.append((ev.kv.key, ev.kv.mod_revision))
                if ev.type == shale.EventType.DELETE:
                    deletes.append(ev)
                if len(got) == len(written):
                    break
        assert sorted(got) == sorted(written) and len(set(got)) == len(got)
        # Each key's changes in order (shards interleave).
        for k in {k for k, _ in written}:
            assert [r for kk, r in got if kk == k] == [r for kk, r in written if kk == k]
        assert len(deletes) == 1 and deletes[0].prev_kv is not None and deletes[0].prev_kv.value == b"v"

    run(endpoints, body)


def test_watch_async_progress_notifications(endpoints: List[str]) -> None:
    async def body(c: shale.aio.Client) -> None:
        pre = b"xp/%d/" % time.monotonic_ns()  # one shard (the last)
        async with c.watch(prefix=pre, progress_notify=True) as w:
            assert await w.wait_started(30)
            it = w.__aiter__()

            async def next_resp() -> shale.WatchResponse:
                return await asyncio.wait_for(it.__anext__(), 15)

            idle = await next_resp()  # the server's interval is 1s
            assert not idle.events and idle.revision > 0, idle
            r = await c.put(pre + b"k", b"v")
            resp = await next_resp()
            while not resp.events:  # a notification sent before the put
                assert resp.revision < r.revision, resp
                resp = await next_resp()
            assert [(ev.kv.key, ev.kv.mod_revision) for ev in resp.events] == [(pre + b"k", r.revision)]
            after = await next_resp()
            assert not after.events and after.revision >= r.revision and after.shard_id == resp.shard_id, after

    run(endpoints, body)


def split_shard_sync(endpoints: List[str], key: bytes) -> Tuple[int, int]:
    with shale.Client(endpoints) as c:
        return split_shard(c, key)


def test_watch_compacted_async(endpoints: List[str]) -> None:
    async def body(c: shale.aio.Client) -> None:
        pre = b"xc/%d/" % time.monotonic_ns()
        await c.put(pre + b"n", b"v")
        _, right = await asyncio.to_thread(split_shard_sync, endpoints, pre + b"m")
        for _ in range(100):  # until the routing knows the new shard
            await c._refresh(shale.client._Deadline(10), -1)
            sh, _ = c._rt.locate(shale.client.Target(pre + b"m"))
            if sh is not None and sh.id == right:
                break
            await asyncio.sleep(0.1)
        async def drain(w: shale.aio.Watcher) -> None:
            async for _ in w:
                pass

        with pytest.raises(shale.Compacted) as ei:
            async with c.watch(pre + b"m", pre + b"z", start_revision=1) as w:
                await asyncio.wait_for(drain(w), 30)
        assert ei.value.compact_revision > 1 and ei.value.shard_id == right

    run(endpoints, body)


def test_closed_client(endpoints: List[str]) -> None:
    async def main() -> None:
        c = shale.aio.Client(endpoints)
        await c.put(b"x", b"1")  # connects on first use
        w = c.watch(prefix=b"x")
        assert await w.wait_started(30)
        await c.close()
        with pytest.raises(shale.ClientClosed):
            await w.__anext__()
        with pytest.raises(shale.ClientClosed):
            await c.get(b"x")

    asyncio.run(main())
