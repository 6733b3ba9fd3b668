"""The asyncio client: :class:`shale.aio.Client`, on grpc.aio.

It has the synchronous :class:`shale.Client`'s surface and behaviour — the
same routing cache, leader following, retries with backoff inside the
call's deadline, request IDs and outcome rules, the same exceptions — with
every call a coroutine, ``scan`` an async generator and ``watch`` an async
iterator. Both clients run the same code for all of that (shale._core and
shale._watch); this module only awaits its steps::

    import asyncio, shale.aio

    async def main() -> None:
        async with shale.aio.Client(["127.0.0.1:7001"]) as c:
            await c.put(b"greeting", b"hello")
            print((await c.get(b"greeting")).value)
            async for kv in c.scan(prefix=b"user/"):
                ...

    asyncio.run(main())

A client belongs to the event loop it first connects in. Calls made before
``connect()`` (or ``async with``) connect first.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Set, Tuple

import grpc
import grpc.aio
from google.protobuf.message import Message

from shale._core import DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_TIMEOUT, Plan, TLSConfig, _Base, _ClosedChannel, _Deadline
from shale._core import _Item, _Refresh, _Send, _Sleep, _Stepper, _TxnBase
from shale._watch import WATCH_BUFFER, _Emit, _Open, _Part, _Recv, _Spawn, _WatchSpec, _WSleep, run_part, watch_spec
from shale.errors import ClientClosed, ShaleError
from shale.types import TTL, Bytes, CasResult, Consistency, DeleteResult, KeyValue, PutResult, TxnResult, WatchEvent, WatchResponse
from shale.v1 import admin_pb2, meta_pb2

__all__ = ["Client", "Txn", "Watcher", "TLSConfig", "DEFAULT_TIMEOUT", "DEFAULT_ATTEMPT_TIMEOUT"]


class Client(_Base):
    """An asyncio connection to a Shale cluster: the arguments, behaviour and
    exceptions are :class:`shale.Client`'s. Use it as an async context
    manager (which connects, and closes it), or ``await c.connect()`` and
    ``await c.close()``. Safe to share between the tasks of one event loop."""

    def _start(self) -> None:
        """Prepare (the constructor does no I/O: connect() does)."""
        # The asyncio objects are made in the event loop, on first use (an
        # older Python binds them to a loop when made).
        self._refresh_lock: Optional[asyncio.Lock] = None
        self._connect_lock: Optional[asyncio.Lock] = None
        self._closed_ev: Optional[asyncio.Event] = None
        self._connected = False
        self._watchers: "weakref.WeakSet[Watcher]" = weakref.WeakSet()

    def _closed_event(self) -> asyncio.Event:
        if self._closed_ev is None:
            self._closed_ev = asyncio.Event()
            if self._closed.is_set():
                self._closed_ev.set()
        return self._closed_ev

    async def connect(self) -> "Client":
        """Load the routing table from the first endpoint that answers (and
        log in, with credentials); raises as :class:`shale.Client`'s
        constructor does. Calls connect on their own if needed."""
        if self._connected:
            return self
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if not self._connected:
                await self._run(self._connect_plan())
                self._connected = True
        return self

    async def close(self) -> None:
        """Close every connection; watches end with ClientClosed. Later calls
        raise :class:`shale.ClientClosed`. Idempotent."""
        chans = self._take_channels()
        self._closed_event().set()
        for w in list(self._watchers):
            w._abort(ClientClosed("client closed", op="watch"))
        for ch in chans:
            await ch.close()

    async def __aenter__(self) -> "Client":
        """Connect; the client itself."""
        try:
            return await self.connect()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc: object) -> None:
        """Close the client."""
        await self.close()

    # -- running plans --

    def _new_channel(self, addr: str) -> grpc.aio.Channel:
        if self._creds is not None:
            return grpc.aio.secure_channel(addr, self._creds, options=self._options)
        return grpc.aio.insecure_channel(addr, options=self._options)

    async def _run(self, plan: Plan[Any], do: Optional[Callable[[Any], Any]] = None) -> Any:
        """Run a plan, awaiting its effects one after the other (by do, or _do)."""
        do = do or self._do
        st = _Stepper(plan)
        while (eff := st.next()) is not None:
            try:
                st.val = await do(eff)
            except Exception as e:
                st.exc = e
        return st.result

    async def _do(self, eff: Any) -> Any:
        if isinstance(eff, _Send):
            return await self._send(eff.method, eff.request, eff.timeout, eff.md)
        if isinstance(eff, _Sleep):
            return await self._sleep(eff.d, eff.deadline)
        if isinstance(eff, _Refresh):
            return await self._refresh(eff.deadline, eff.seen)
        raise TypeError(f"shale: not an effect: {eff!r}")

    async def _call(self, plan: Plan[Any]) -> Any:
        if not self._connected:
            await self.connect()
        return await self._run(plan)

    async def _sleep(self, d: float, deadline: _Deadline) -> bool:
        """Wait d seconds, or until the deadline or close; True if the full wait passed."""
        rem = deadline.remaining()
        full = rem is None or rem > d
        try:
            await asyncio.wait_for(self._closed_event().wait(), d if full else max(rem or 0, 0))
            return False
        except asyncio.TimeoutError:
            return full

    async def _send(self, method: Any, request: Message, timeout: Optional[float], md: List[Tuple[str, str]]) -> Any:
        try:
            return await method(request, timeout=timeout, metadata=md or None)
        except (grpc.aio.UsageError, ValueError, RuntimeError) as e:
            # The channel was closed under the call: it never left.
            if self._closed.is_set():
                raise ClientClosed("client closed") from e
            raise _ClosedChannel(str(e)) from e

    async def _refresh(self, deadline: _Deadline, seen: int) -> None:
        """Reload the routing table: one refresh shared by concurrent callers
        (see shale.Client._refresh)."""
        if self._refresh_lock is None:
            self._refresh_lock = asyncio.Lock()
        async with self._refresh_lock:
            if seen >= 0 and self._rt.generation() > seen:
                return
            await self._run(self._fetch_routing_plan(deadline))

    def _deadline(self, timeout: Optional[float]) -> _Deadline:
        return _Deadline(self._timeout if timeout is None else timeout)

    # -- KV API (documented on shale.Client) --

    async def get(self, key: Bytes, *, consistency: str = Consistency.LINEARIZABLE, must_exist: bool = False, timeout: Optional[float] = None) -> Optional[KeyValue]:
        """:meth:`shale.Client.get`, awaited."""
        return await self._call(self._get_plan(key, consistency, must_exist, timeout))  # type: ignore[no-any-return]

    async def multi_get(self, keys: Sequence[Bytes], *, consistency: str = Consistency.LINEARIZABLE, timeout: Optional[float] = None) -> List[Optional[KeyValue]]:
        """:meth:`shale.Client.multi_get`, awaited."""
        return await self._call(self._multi_get_plan(keys, consistency, timeout))  # type: ignore[no-any-return]

    async def put(self, key: Bytes, value: Bytes, *, ttl: Optional[TTL] = None, prev_kv: bool = False, request_id: Optional[bytes] = None, timeout: Optional[float] = None) -> PutResult:
        """:meth:`shale.Client.put`, awaited (a retried put applies once;
        OutcomeUnknown when it may or may not have applied)."""
        return await self._call(self._put_plan(key, value, ttl, prev_kv, request_id, timeout))  # type: ignore[no-any-return]

    async def delete(self, key: Bytes, *, prev_kv: bool = False, request_id: Optional[bytes] = None, timeout: Optional[float] = None) -> DeleteResult:
        """:meth:`shale.Client.delete`, awaited."""
        return await self._call(self._delete_plan(key, prev_kv, request_id, timeout))  # type: ignore[no-any-return]

    async def delete_range(self, start: Optional[Bytes], end: Optional[Bytes], *, timeout: Optional[float] = None) -> None:
        """:meth:`shale.Client.delete_range`, awaited."""
        await self._call(self._delete_range_plan(start, end, timeout))

    async def cas(self, key: Bytes, expected: Optional[Bytes], new_value: Bytes, *, ttl: Optional[TTL] = None, must_succeed: bool = False, request_id: Optional[bytes] = None, timeout: Optional[float] = None) -> CasResult:
        """:meth:`shale.Client.cas`, awaited."""
        return await self._call(self._cas_plan(key, expected, new_value, ttl, must_succeed, request_id, timeout))  # type: ignore[no-any-return]

    def scan(self, start: Optional[Bytes] = None, end: Optional[Bytes] = None, *, prefix: Optional[Bytes] = None, reverse: bool = False, limit: Optional[int] = None, keys_only: bool = False, page_size: Optional[int] = None, consistency: str = Consistency.LINEARIZABLE, timeout: Optional[float] = None) -> AsyncIterator[KeyValue]:
        """:meth:`shale.Client.scan` as an async generator (``async for kv in
        c.scan(...)``): one page in memory at a time. Bad arguments raise
        InvalidArgument here, before any request."""
        return self._items(self._scan_plan(start, end, prefix, reverse, limit, keys_only, page_size, consistency, timeout))

    async def _items(self, plan: Plan[None]) -> AsyncIterator[KeyValue]:
        """Run a plan that yields _Item effects, as an async generator of their values."""
        if not self._connected:
            await self.connect()
        st = _Stepper(plan)
        while (eff := st.next()) is not None:
            if isinstance(eff, _Item):
                yield eff.value
                continue
            try:
                st.val = await self._do(eff)
            except Exception as e:
                st.exc = e

    def txn(self) -> "Txn":
        """Start a transaction: :meth:`shale.Client.txn`, finished with
        ``await txn.commit()``."""
        return Txn(self)

    def watch(self, start: Optional[Bytes] = None, end: Optional[Bytes] = None, *, prefix: Optional[Bytes] = None, start_revision: Optional[int] = None, prev_kv: bool = False, progress_notify: bool = False) -> "Watcher":
        """:meth:`shale.Client.watch` as an async iterator of
        :class:`shale.WatchResponse` (a task per shard part; the same
        promise: every change once, in order, or :class:`shale.Compacted`)::

            async with c.watch(prefix=b"user/") as w:
                async for resp in w:
                    ...

        Call it from a running event loop; bad arguments raise
        InvalidArgument here, at once."""
        spec = watch_spec(self, start, end, prefix, start_revision, prev_kv, progress_notify)
        w = Watcher(self, spec)
        self._watchers.add(w)
        w._spawn(spec.first_part())
        return w

    async def _commit_txn(self, txn: "Txn", request_id: Optional[bytes], timeout: Optional[float]) -> TxnResult:
        return await self._call(self._txn_plan(txn, request_id, timeout))  # type: ignore[no-any-return]

    # -- Admin --

    async def cluster_status(self, *, timeout: Optional[float] = None) -> admin_pb2.ClusterStatusResponse:
        """:meth:`shale.Client.cluster_status`, awaited."""
        return await self._call(self._cluster_status_plan(timeout))  # type: ignore[no-any-return]

    def routing(self) -> Tuple[List[Tuple[meta_pb2.ShardDescriptor, int]], Dict[int, str]]:
        """:meth:`shale.Client.routing` (empty before connect())."""
        return self._rt.snapshot()


class Txn(_TxnBase):
    """A transaction under construction (see :class:`shale.Txn`), made by
    :meth:`Client.txn` and run by ``await commit()``."""

    async def commit(self, *, request_id: Optional[bytes] = None, timeout: Optional[float] = None) -> TxnResult:
        """Run the transaction atomically on its shard: :meth:`shale.Txn.commit`, awaited."""
        c = self._client
        assert isinstance(c, Client)
        return await c._commit_txn(self, request_id, timeout)


class Watcher:
    """A running watch (:meth:`Client.watch`): an async iterator of
    :class:`shale.WatchResponse`; ``await close()`` it (or use it as an
    async context manager) to stop its streams. Iterate it from one task."""

    def __init__(self, client: Client, spec: _WatchSpec) -> None:
        self._client = client
        self._spec = spec
        self._q: "asyncio.Queue[WatchResponse]" = asyncio.Queue(maxsize=WATCH_BUFFER)
        self._changed = asyncio.Event()  # a response queued, a part ended, or close
        self._live = 0
        self._tasks: Set["asyncio.Task[None]"] = set()
        self._calls: Set[Any] = set()
        self._closed = False
        self._done = False

    def __aiter__(self) -> "Watcher":
        """The watcher itself."""
        return self

    async def __anext__(self) -> WatchResponse:
        """The next response; raises the error that ended the watch (see
        :meth:`shale.Client.watch`), or StopAsyncIteration once closed."""
        while not self._done:
            if not self._q.empty():
                return self._q.get_nowait()
            if self._live == 0 or self._closed:
                self._done = True
                break
            self._changed.clear()
            await self._changed.wait()
        err = self._spec.err
        if err is not None and not self._closed:
            self._spec.err = None  # raised once
            raise err
        raise StopAsyncIteration

    async def events(self) -> AsyncIterator[WatchEvent]:
        """The events of the responses, one by one."""
        async for resp in self:
            for ev in resp.events:
                yield ev

    async def wait_started(self, timeout: Optional[float] = None) -> bool:
        """:meth:`shale.Watcher.wait_started`, awaited."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while not self._spec.ready.is_set():
            if self._spec.stop.is_set() or (end is not None and loop.time() >= end):
                return False
            await asyncio.sleep(0.01)
        return True

    async def close(self) -> None:
        """Stop every stream of the watch; iteration ends. Idempotent."""
        self._closed = True
        self._stop()
        others = [t for t in self._tasks if t is not asyncio.current_task()]
        await asyncio.gather(*others, return_exceptions=True)

    async def __aenter__(self) -> "Watcher":
        """The watcher itself."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the watcher."""
        await self.close()

    def _abort(self, err: ShaleError) -> None:
        self._spec.fail(err)
        self._stop()

    def _stop(self) -> None:
        self._spec.stop.set()
        me = asyncio.current_task() if _in_loop() else None
        for t in list(self._tasks):
            if t is not me:
                t.cancel()
        for c in list(self._calls):
            c.cancel()
        self._changed.set()

    def _spawn(self, p: _Part) -> None:
        self._live += 1
        t = asyncio.get_running_loop().create_task(self._part(p))
        self._tasks.add(t)

    async def _part(self, p: _Part) -> None:
        err: Optional[ShaleError] = None
        try:
            err = await self._client._run(run_part(self._spec, p), self._effect)
        except asyncio.CancelledError:
            err = None
        except Exception as e:  # a bug: end the watch with it rather than hang
            err = e if isinstance(e, ShaleError) else ShaleError(f"watch: {e!r}", op="watch")
        finally:
            self._live -= 1
            self._changed.set()
        if err is not None:
            self._abort(err)

    async def _effect(self, eff: Any) -> Any:
        stop = self._spec.stop
        if isinstance(eff, _Recv):
            try:
                m = await eff.stream.read()
            except grpc.aio.UsageError as e:  # the channel was closed under it
                self._calls.discard(eff.stream)
                raise _ClosedChannel(str(e)) from e
            except BaseException:
                self._calls.discard(eff.stream)
                raise
            if m is grpc.aio.EOF:
                self._calls.discard(eff.stream)
                return None
            return m
        if isinstance(eff, _Emit):
            if stop.is_set():
                return False
            await self._q.put(eff.resp)
            self._changed.set()
            return True
        if isinstance(eff, _Open):
            try:
                call = eff.method(eff.request, metadata=eff.md)
            except grpc.aio.UsageError as e:  # the channel was closed under it
                raise _ClosedChannel(str(e)) from e
            self._calls.add(call)
            return call
        if isinstance(eff, _WSleep):
            await asyncio.sleep(eff.d)
            return not stop.is_set()
        if isinstance(eff, _Spawn):
            self._spawn(eff.part)
            return None
        return await self._client._do(eff)


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False
