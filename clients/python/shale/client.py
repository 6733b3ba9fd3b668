"""The synchronous Shale client: :class:`Client`.

It behaves as the Go SDK does (client/doc.go, docs/client.md): it learns the
shard layout from any node (Admin.GetRouting), sends every request to the
shard that owns its key, at that shard's leader, and follows leader changes,
splits and node failures on its own:

- NotLeader with a leader hint: the hint is remembered and the request resent
  there at once (after three hints in a row, with backoff); without a hint
  another replica is tried after a backoff.
- EpochMismatch: the descriptors it carries are installed and the request
  resent; KeyOutsideShard and ShardNotFound refresh the routing (one
  GetRouting shared by concurrent callers) and resend.
- UNAVAILABLE, an attempt timeout, a lost connection: the next replica after
  an exponential backoff with full jitter.
- RESOURCE_EXHAUSTED: the same request after a backoff, unless it is gRPC's
  "message larger than max", which is InvalidArgument at once.
- INVALID_ARGUMENT and everything else: raised at once.

Retries stop at the call's deadline (``timeout``) or after ``max_attempts``
attempts. Every write carries a 12-byte random request ID reused by all its
attempts, so a retried write applies at most once; a write that failed after
an attempt that may have applied raises :class:`shale.OutcomeUnknown`.
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import grpc
from google.protobuf.message import Message

from shale._core import (
    _ClosedChannel,
    _Deadline,
    _Base,
    _Item,
    _Refresh,
    _Send,
    _Sleep,
    _Stepper,
    _TxnBase,
    DEFAULT_ATTEMPT_TIMEOUT,
    DEFAULT_TIMEOUT,
    REQUEST_ID_LEN,
    Plan,
    TLSConfig,
)
from shale._routing import Target
from shale._watch import WATCH_BUFFER, _Emit, _Open, _Part, _Recv, _Spawn, _WatchSpec, _WSleep, run_part, watch_spec
from shale.errors import ClientClosed, ShaleError
from shale.types import (
    TTL,
    Bytes,
    CasResult,
    Consistency,
    DeleteResult,
    KeyValue,
    PutResult,
    TxnResult,
    WatchEvent,
    WatchResponse,
)
from shale.v1 import admin_pb2

__all__ = [
    "Client",
    "Txn",
    "Watcher",
    "TLSConfig",
    "DEFAULT_TIMEOUT",
    "DEFAULT_ATTEMPT_TIMEOUT",
    "REQUEST_ID_LEN",
]



class Client(_Base):
    """A connection to a Shale cluster.

    ``endpoints`` are ``host:port`` addresses of any of the cluster's nodes (a
    list, or one string of comma-separated addresses); the constructor loads
    the routing table from the first that answers Admin.GetRouting and raises
    :class:`shale.Unavailable` (:class:`shale.DeadlineExceeded` after
    ``timeout``) when none does, sooner (after 2 s) when every endpoint
    refuses connections. Use it as a context manager, or call :meth:`close`::

        with shale.Client(["127.0.0.1:7001", "127.0.0.1:7002"]) as c:
            c.put(b"greeting", b"hello")
            print(c.get(b"greeting").value)

    Keys and values are bytes; str is accepted too and encoded as UTF-8.
    Results always hold bytes. A Client is safe to share between threads.

    Args:
        endpoints: the addresses to learn the cluster from.
        timeout: the deadline, in seconds, of each call with all its retries
            (and of connecting) when the call gives none; None for no
            deadline. Default 10.
        attempt_timeout: the bound on one attempt (one RPC to one replica),
            so that a replica that does not answer is given up for the next
            before the call's deadline; None for only the call's deadline.
            Default 3.
        backoff_initial, backoff_max: the retry backoff's bounds in seconds
            (exponential with full jitter). Defaults 0.02 and 1.
        max_attempts: a cap on the attempts of one call; 0 (the default):
            retries end only at the deadline.
        tls: None for plaintext; a :class:`TLSConfig`, True (TLS with the
            system's roots) or ``grpc.ChannelCredentials`` for TLS.
        user, password: authenticate as user (Auth.Authenticate) and send its
            token with every call, renewing it before it expires and when a
            node refuses it. Unauthenticated is raised at once by the
            constructor when the credentials are refused.
        channel_options: further gRPC channel arguments, after the client's.
    """


    def _start(self) -> None:
        """Connect (called by the constructor)."""
        self._refresh_mu = threading.Lock()
        self._watchers: "weakref.WeakSet[Watcher]" = weakref.WeakSet()
        try:
            self._run(self._connect_plan())
        except BaseException:
            self.close()
            raise

    # -- lifetime --

    def close(self) -> None:
        """Close every connection; watches end with ClientClosed. Later calls
        raise :class:`shale.ClientClosed`. Idempotent."""
        chans = self._take_channels()
        for w in list(self._watchers):
            w._abort(ClientClosed("client closed", op="watch"))
        for ch in chans:
            ch.close()

    def __enter__(self) -> "Client":
        """Return the client itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the client."""
        self.close()

    # -- running plans --

    def _new_channel(self, addr: str) -> grpc.Channel:
        if self._creds is not None:
            return grpc.secure_channel(addr, self._creds, options=self._options)
        return grpc.insecure_channel(addr, options=self._options)

    def _run(self, plan: Plan[Any], do: Optional[Callable[[Any], Any]] = None) -> Any:
        """Run a plan in this thread: its effects one after the other (by do,
        or _do)."""
        do = do or self._do
        st = _Stepper(plan)
        while (eff := st.next()) is not None:
            st.run(do, eff)
        return st.result

    def _do(self, eff: Any) -> Any:
        if isinstance(eff, _Send):
            return self._send(eff.method, eff.request, eff.timeout, eff.md)
        if isinstance(eff, _Sleep):
            return self._sleep(eff.d, eff.deadline)
        if isinstance(eff, _Refresh):
            return self._refresh(eff.deadline, eff.seen)
        raise TypeError(f"shale: not an effect: {eff!r}")

    def _sleep(self, d: float, deadline: _Deadline) -> bool:
        """Wait d seconds, or until the deadline or close; True if the full wait passed."""
        rem = deadline.remaining()
        if rem is not None and rem <= d:
            self._closed.wait(max(rem, 0))
            return False
        return not self._closed.wait(d)

    def _send(self, method: Any, request: Message, timeout: Optional[float], md: List[Tuple[str, str]]) -> Any:
        try:
            return method(request, timeout=timeout, metadata=md or None)
        except ValueError as e:
            # The channel was closed under the call (the client closed, or
            # the channel was retired): it never left.
            if self._closed.is_set():
                raise ClientClosed("client closed") from e
            raise _ClosedChannel(str(e)) from e

    def _refresh(self, deadline: _Deadline, seen: int) -> None:
        """Reload the routing table; concurrent callers share one refresh, and
        a caller that saw generation ``seen`` returns at once if a refresh
        completed since (seen < 0 always refreshes)."""
        with self._refresh_mu:
            if seen >= 0 and self._rt.generation() > seen:
                return
            self._run(self._fetch_routing_plan(deadline))

    def _deadline(self, timeout: Optional[float]) -> _Deadline:
        return _Deadline(self._timeout if timeout is None else timeout)

    # -- KV API --

    def get(self, key: Bytes, *, consistency: str = Consistency.LINEARIZABLE, must_exist: bool = False, timeout: Optional[float] = None) -> Optional[KeyValue]:

        """Read ``key``: its :class:`KeyValue`, or None when it is absent
        (never written, deleted or expired); with ``must_exist=True`` an
        absent key raises :class:`shale.NotFound` (a KeyError) instead.

        ``consistency`` is one of :class:`shale.Consistency`'s values
        (default linearizable). ``timeout`` overrides the client's default
        deadline for this call.
        """
        return self._run(self._get_plan(key, consistency, must_exist, timeout))  # type: ignore[no-any-return]

    def multi_get(self, keys: Sequence[Bytes], *, consistency: str = Consistency.LINEARIZABLE, timeout: Optional[float] = None) -> List[Optional[KeyValue]]:
        """Read several keys: ``result[i]`` is the KeyValue of ``keys[i]``, None
        when absent. The keys are grouped by shard and each shard is asked
        once (one after the other), so the values of one shard are read at
        one point of its history, but different shards at different points.
        Duplicate keys are allowed."""
        return self._run(self._multi_get_plan(keys, consistency, timeout))  # type: ignore[no-any-return]

    def put(self, key: Bytes, value: Bytes, *, ttl: Optional[TTL] = None, prev_kv: bool = False, request_id: Optional[bytes] = None, timeout: Optional[float] = None) -> PutResult:
        """Set ``key`` to ``value``.

        Args:
            ttl: expire the key this many seconds (or this timedelta) after
                the write applies, rounded up to milliseconds; None or 0:
                never. Negative: InvalidArgument.
            prev_kv: return the key's previous value in PutResult.prev_kv.
            request_id: the application's own request ID (8 to 32 bytes)
                instead of a random one, so that the write can be sent again
                after an OutcomeUnknown (or a restart of the application) and
                apply at most once.
            timeout: this call's deadline in seconds (default: the client's).

        A put retried after a failure carries the same request ID, so it
        applies at most once. Raises OutcomeUnknown when it may or may not
        have applied; any other exception means it did not.
        """
        return self._run(self._put_plan(key, value, ttl, prev_kv, request_id, timeout))  # type: ignore[no-any-return]

    def delete(self, key: Bytes, *, prev_kv: bool = False, request_id: Optional[bytes] = None, timeout: Optional[float] = None) -> DeleteResult:
        """Remove ``key``. Deleting an absent key is not an error
        (DeleteResult.deleted is False). With ``prev_kv``, the deleted value
        is in DeleteResult.prev_kv. ``request_id`` and the outcome rules are
        :meth:`put`'s."""
        return self._run(self._delete_plan(key, prev_kv, request_id, timeout))  # type: ignore[no-any-return]

    def delete_range(self, start: Optional[Bytes], end: Optional[Bytes], *, timeout: Optional[float] = None) -> None:
        """Remove every key in [start, end); an empty or None end is the end
        of the key space, an empty or None start its beginning (so
        ``delete_range(None, None)`` deletes everything). A start at or after
        a non-empty end is InvalidArgument, raised before any request.

        One request per shard the range overlaps, in key order, each its own
        write with its own request ID: atomic only within each shard. If it
        fails part-way, a prefix of the range (whole shards' parts) may be
        deleted already; calling it again completes it."""
        self._run(self._delete_range_plan(start, end, timeout))

    def cas(self, key: Bytes, expected: Optional[Bytes], new_value: Bytes, *, ttl: Optional[TTL] = None, must_succeed: bool = False, request_id: Optional[bytes] = None, timeout: Optional[float] = None) -> CasResult:
        """Compare-and-swap: atomically set ``key`` to ``new_value`` if its
        current value is ``expected`` — or, with ``expected=None``, if the key
        is absent (a create-if-absent; ``b""`` expects an existing empty
        value).

        Returns a :class:`CasResult`: ``succeeded`` (also its truth value) and
        ``current``, the key's value before the operation (None when absent),
        which on failure says what the value is. A failed comparison is not
        an error, unless ``must_succeed=True``: then it raises
        :class:`shale.CompareFailed` carrying ``current``. ``ttl``,
        ``request_id`` and the outcome rules are :meth:`put`'s."""
        return self._run(self._cas_plan(key, expected, new_value, ttl, must_succeed, request_id, timeout))  # type: ignore[no-any-return]

    def scan(self, start: Optional[Bytes] = None, end: Optional[Bytes] = None, *, prefix: Optional[Bytes] = None, reverse: bool = False, limit: Optional[int] = None, keys_only: bool = False, page_size: Optional[int] = None, consistency: str = Consistency.LINEARIZABLE, timeout: Optional[float] = None) -> Iterator[KeyValue]:
        """Iterate over the keys in [start, end) in key order (reverse order
        with ``reverse=True``), as :class:`KeyValue` objects.

        None or empty ``start`` is the beginning of the key space, None or
        empty ``end`` its end. With ``prefix``, the keys starting with it
        (start and end must then be None). ``limit`` stops after that many
        keys; ``keys_only`` leaves the values out (b""). Invalid arguments (an
        inverted range, prefix with bounds, a negative limit) raise
        InvalidArgument here, before any request.

        The iterator walks the shards the range overlaps in order, one page
        at a time (a unary Scan per page: at most the server's page, 1,000
        keys and 3 MiB, or ``page_size`` keys), so memory stays bounded
        however large the range. It follows the server's continuation tokens
        from shard to shard and survives leader changes and splits like any
        request; each page request gets its own deadline (``timeout``, or the
        client's). Pages are read at different times: a scan is not a
        snapshot, but returns each key present throughout it once, in order.
        """
        return self._items(self._scan_plan(start, end, prefix, reverse, limit, keys_only, page_size, consistency, timeout))

    def _items(self, plan: Plan[None]) -> Iterator[KeyValue]:
        """Run a plan that yields _Item effects, as a generator of their values."""
        st = _Stepper(plan)
        while (eff := st.next()) is not None:
            if isinstance(eff, _Item):
                yield eff.value
            else:
                st.run(self._do, eff)

    def txn(self) -> "Txn":
        """Start a transaction: chain :meth:`Txn.compare`, :meth:`Txn.then`
        and :meth:`Txn.else_`, and finish with :meth:`Txn.commit`::

            r = (c.txn()
                 .compare(shale.Value(b"acct/1") == b"100")
                 .then(shale.Put(b"acct/1", b"90"), shale.Get(b"acct/1/log"))
                 .else_(shale.Get(b"acct/1"))
                 .commit())
        """
        return Txn(self)

    def watch(self, start: Optional[Bytes] = None, end: Optional[Bytes] = None, *, prefix: Optional[Bytes] = None, start_revision: Optional[int] = None, prev_kv: bool = False, progress_notify: bool = False) -> "Watcher":
        """Follow the changes to the keys in [start, end) (None or empty end:
        the end of the key space; with ``prefix``, the keys starting with it)
        and return a :class:`Watcher`: an iterator of
        :class:`shale.WatchResponse` (the changes of one shard's part of the
        range, in revision order), to close when done (or use as a context
        manager)::

            with c.watch(prefix=b"user/") as w:
                for resp in w:
                    for ev in resp.events:    # ev.type, ev.kv, ev.prev_kv
                        ...

        The range may span shards: the watcher streams each shard's part and
        follows splits, merges, leader changes and node restarts, resuming
        every part from the revision after the last one it delivered, so
        every change is delivered exactly once, each key's changes in
        revision order. When a shard no longer has the history to resume
        from, iteration ends by raising :class:`shale.Compacted` (never a
        silent gap). It also ends by raising InvalidArgument,
        PermissionDenied or Unauthenticated (not retried), and
        ClientClosed when the client closes; after :meth:`Watcher.close` it
        just stops.

        Args:
            start_revision: deliver the changes from this revision of every
                shard the range covers (revisions are per shard: use it for
                a range inside one shard, or with a revision from an earlier
                watch or read); None: only the changes after now.
            prev_kv: give every event the key's previous value.
            progress_notify: also deliver a response without events when a
                shard's part has been idle for the server's progress
                interval (its revision says the part is current through it).

        At most 16 responses wait for the reader (a thread per shard part
        streams them); a reader far behind makes the server drop a stream as
        too slow, which the watcher resumes from where it was. Bad arguments
        raise InvalidArgument here, at once."""
        spec = watch_spec(self, start, end, prefix, start_revision, prev_kv, progress_notify)
        w = Watcher(self, spec)
        self._watchers.add(w)
        w._spawn(spec.first_part())
        return w

    def _commit_txn(self, txn: "Txn", request_id: Optional[bytes], timeout: Optional[float]) -> TxnResult:
        return self._run(self._txn_plan(txn, request_id, timeout))  # type: ignore[no-any-return]

    # -- Admin --

    def cluster_status(self, *, timeout: Optional[float] = None) -> admin_pb2.ClusterStatusResponse:
        """The cluster's status (Admin.ClusterStatus, from any node): the
        nodes with their liveness, and every shard with its descriptor,
        leader and Raft state, as a ``shale.v1.ClusterStatusResponse``."""
        return self._run(self._cluster_status_plan(timeout))  # type: ignore[no-any-return]


class Txn(_TxnBase):
    """A transaction under construction: if all its comparisons hold, its
    ``then`` operations apply, else its ``else_`` operations, atomically.
    Every key it touches (compared or operated on, and the whole of every
    deleted range) must be in one shard; the client checks this against its
    routing before sending and raises :class:`shale.CrossShard` otherwise.
    Make one with :meth:`Client.txn`. Not safe for concurrent use."""

    def commit(self, *, request_id: Optional[bytes] = None, timeout: Optional[float] = None) -> TxnResult:
        """Run the transaction atomically on its shard and return a
        :class:`TxnResult` (``succeeded`` says which branch ran; ``results[i]``
        answers the i-th operation of that branch). Like every write, a
        retried commit carries one request ID and applies at most once;
        ``request_id`` and the outcome rules are :meth:`Client.put`'s."""
        c = self._client
        assert isinstance(c, Client)
        return c._commit_txn(self, request_id, timeout)



class Watcher:
    """A running watch (:meth:`Client.watch`): an iterator of
    :class:`shale.WatchResponse`. Close it (or use it as a context manager)
    to stop its streams; iteration then ends. Iterate it from one thread."""

    def __init__(self, client: Client, spec: _WatchSpec) -> None:
        self._client = client
        self._spec = spec
        self._q: "queue.Queue[WatchResponse]" = queue.Queue(maxsize=WATCH_BUFFER)
        self._mu = threading.Lock()
        self._live = 0  # parts running
        self._calls: Set[Any] = set()  # the streams open now
        self._threads: List[threading.Thread] = []
        self._closed = False  # by close()
        self._done = False

    def __iter__(self) -> "Watcher":
        """The watcher itself."""
        return self

    def __next__(self) -> WatchResponse:
        """The next response; raises the error that ended the watch (see
        :meth:`Client.watch`), or StopIteration once closed."""
        while not self._done:
            try:
                return self._q.get(timeout=0.1)
            except queue.Empty:
                pass
            with self._mu:
                finished = self._live == 0 or self._closed
            if finished and self._q.empty():
                self._done = True
        err = self._spec.err
        if err is not None and not self._closed:
            self._spec.err = None  # raised once
            raise err
        raise StopIteration

    def wait_started(self, timeout: Optional[float] = None) -> bool:
        """Wait until a stream of every part of the range has started, so
        that every change from then on will be delivered (with the default
        start, a watch delivers the changes after its streams start); False
        if that did not happen within timeout seconds."""
        return self._spec.ready.wait(timeout)

    def events(self) -> Iterator[WatchEvent]:
        """The events of the responses, one by one (progress notifications,
        which have none, are passed over)."""
        for resp in self:
            yield from resp.events

    def close(self) -> None:
        """Stop every stream of the watch; iteration ends. Idempotent."""
        with self._mu:
            self._closed = True
        self._stop()
        for t in list(self._threads):
            if t is not threading.current_thread():
                t.join(timeout=5)

    def __enter__(self) -> "Watcher":
        """The watcher itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the watcher."""
        self.close()

    def _abort(self, err: ShaleError) -> None:
        """End the watch with err."""
        self._spec.fail(err)
        self._stop()

    def _stop(self) -> None:
        self._spec.stop.set()
        with self._mu:
            calls = list(self._calls)
        for c in calls:
            c.cancel()

    def _spawn(self, p: _Part) -> None:
        t = threading.Thread(target=self._part, args=(p,), name="shale-watch", daemon=True)
        with self._mu:
            self._live += 1
            self._threads.append(t)
        t.start()

    def _part(self, p: _Part) -> None:
        try:
            err = self._drive(run_part(self._spec, p))
        except Exception as e:  # a bug: end the watch with it rather than hang
            err = e if isinstance(e, ShaleError) else ShaleError(f"watch: {e!r}", op="watch")
        if err is not None:
            self._abort(err)
        with self._mu:
            self._live -= 1

    def _drive(self, plan: Plan[Optional[ShaleError]]) -> Optional[ShaleError]:
        return self._client._run(plan, self._effect)  # type: ignore[no-any-return]

    def _effect(self, eff: Any) -> Any:
        stop = self._spec.stop
        if isinstance(eff, _Recv):
            try:
                return next(eff.stream)
            except StopIteration:
                return None
            finally:
                if stop.is_set():
                    eff.stream.cancel()
        if isinstance(eff, _Emit):
            while not stop.is_set():
                try:
                    self._q.put(eff.resp, timeout=0.1)
                    return True
                except queue.Full:
                    pass
            return False
        if isinstance(eff, _Open):
            try:
                call = eff.method(eff.request, metadata=eff.md)
            except ValueError as e:  # the channel was closed under it
                raise _ClosedChannel(str(e)) from e
            with self._mu:
                self._calls.add(call)
            if stop.is_set():
                call.cancel()
            return _Stream(self, call)
        if isinstance(eff, _WSleep):
            return not stop.wait(eff.d)
        if isinstance(eff, _Spawn):
            self._spawn(eff.part)
            return None
        return self._client._do(eff)


class _Stream:
    """A Watch stream's call, forgotten by the watcher when it ends."""

    def __init__(self, w: Watcher, call: Any) -> None:
        self.w = w
        self.call = call

    def __next__(self) -> Any:
        try:
            return next(self.call)
        except BaseException:
            with self.w._mu:
                self.w._calls.discard(self.call)
            raise

    def cancel(self) -> None:
        self.call.cancel()
