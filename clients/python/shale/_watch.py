"""The watch's logic, shared by both clients: the Go SDK's client/watch.go
as a plan per part of the watched range (see shale._core for plans).

A watch runs one part per shard its range covers (a thread in the
synchronous client, a task in the asyncio one). Each part streams KV.Watch
from its shard's leader and keeps ``next``, the first revision it has not
delivered; after any break (a node down or restarted, a leader change, a
stream dropped as too slow) it resumes from ``next`` on the shard it last
streamed on, with the epoch its range was found at (``range_epoch``) and the
shard whose revisions ``next`` counts (``revision_shard_id``), so the
server can refuse a resume that would skip changes. A stream that ends with
a range change (a split or a merge) re-resolves its part and continues from
the revision after the change on the shards that hold it now. A refusal for
lost history (OUT_OF_RANGE with WatchInterrupted) ends the whole watch with
:class:`shale.Compacted`.
"""

from __future__ import annotations

import logging
import random
import threading
from typing import Any, List, Optional, Set, Tuple

import grpc

from shale._core import (
    _TARGET_NODE_KEY,
    _Deadline,
    _Failure,
    _NoNodeAnswered,
    _pick_replica,
    _rejected,
    _Refresh,
    _with_token,
    _Base,
    _ClosedChannel,
    _MAX_IMMEDIATE,
    Plan,
    _scan_range,
)
from shale._routing import Routing, Target
from shale.errors import ClientClosed, Compacted, InvalidArgument, ShaleError, Unauthenticated
from shale.types import WatchEvent, WatchResponse
from shale.v1 import kv_pb2, meta_pb2

log = logging.getLogger("shale")

#: How many responses a watch holds for its reader before its streams wait
#: (the Go SDK's channel capacity): a slow reader holds the streams back,
#: the server then drops them as too slow, and the watch resumes them.
WATCH_BUFFER = 16


class _WSleep:
    """Effect: wait d seconds unless the watch stops; the result is False
    when it stopped."""

    __slots__ = ("d",)

    def __init__(self, d: float) -> None:
        self.d = d


class _Spawn:
    """Effect: run another part of the range alongside."""

    __slots__ = ("part",)

    def __init__(self, part: "_Part") -> None:
        self.part = part


class _Open:
    """Effect: start a Watch stream; the result is its handle for _Recv."""

    __slots__ = ("method", "request", "md")

    def __init__(self, method: Any, request: kv_pb2.WatchRequest, md: List[Tuple[str, str]]) -> None:
        self.method = method
        self.request = request
        self.md = md


class _Recv:
    """Effect: the stream's next message, None at its end; its gRPC error is
    thrown into the plan."""

    __slots__ = ("stream",)

    def __init__(self, stream: Any) -> None:
        self.stream = stream


class _Emit:
    """Effect: hand a response to the reader (waiting while its buffer is
    full); the result is False when the watch stopped."""

    __slots__ = ("resp",)

    def __init__(self, resp: WatchResponse) -> None:
        self.resp = resp


class _Part:
    """A part of the range watched on one shard."""

    __slots__ = ("lo", "hi", "shard", "epoch", "next", "rev_shard", "fresh")

    def __init__(self, lo: bytes, hi: bytes, nxt: int, rev_shard: int = 0) -> None:
        self.lo = lo
        self.hi = hi  # b"": the end of the key space
        # The shard serving the part and its epoch when the part was found
        # inside it (0: to resolve).
        self.shard = 0
        self.epoch = 0
        # The first revision still to deliver (0: after the shard's current
        # one, until the first response fixes it).
        self.next = nxt
        # The shard whose revisions next counts: the last one a stream of
        # the part started on (0: none yet). A shard split off keeps its
        # parent's revisions; one that absorbed the part's shard in a merge
        # does not, and refuses a resume that would skip changes.
        self.rev_shard = rev_shard
        self.fresh = True  # no stream of it has started yet


class _WatchSpec:
    """One watch call: its range and options, and how it ends."""

    def __init__(self, client: _Base, lo: bytes, hi: bytes, prev_kv: bool, progress: bool, start_revision: int) -> None:
        self.client = client
        self.lo = lo
        self.hi = hi
        self.prev_kv = prev_kv
        self.progress = progress
        self.start_revision = start_revision
        self.mu = threading.Lock()
        self.stop = threading.Event()
        self.err: Optional[ShaleError] = None  # the first terminal error
        self.pending = 0  # parts no stream of which has started yet
        self.ready = threading.Event()  # set while pending is 0

    def fail(self, err: ShaleError) -> bool:
        """Record a terminal error (the first wins) and stop every part;
        False if the watch had stopped already."""
        with self.mu:
            if self.stop.is_set():
                return False
            self.err = err
            self.stop.set()
            return True

    def new_part(self, lo: bytes, hi: bytes, nxt: int, rev_shard: int = 0) -> _Part:
        with self.mu:
            self.pending += 1
            self.ready.clear()
        return _Part(lo, hi, nxt, rev_shard)

    def first_part(self) -> _Part:
        return self.new_part(self.lo, self.hi, self.start_revision)

    def part_started(self, p: _Part) -> None:
        """Count p as started (once): its first stream began, or it ended."""
        if not p.fresh:
            return
        p.fresh = False
        with self.mu:
            self.pending -= 1
            if self.pending == 0:
                self.ready.set()


def _deadline(c: _Base) -> _Deadline:
    return _Deadline(c._timeout)


def _refresh(c: _Base, seen: int) -> Plan[None]:
    try:
        yield _Refresh(_deadline(c), seen)
    except _NoNodeAnswered:
        pass


def _resolve(w: _WatchSpec, p: _Part) -> Plan[bool]:
    """Find the shard holding the start of p; a part reaching beyond it is
    cut there and the rest spawned as a new part. False: the watch stopped."""
    c = w.client
    attempt = 0
    while True:
        attempt += 1
        sh, gen = c._rt.locate(Target(p.lo))
        if sh is not None:
            p.shard, p.epoch = sh.id, sh.epoch
            e = sh.desc.end_key
            if e and (not p.hi or p.hi > e):
                yield _Spawn(w.new_part(e, p.hi, p.next, p.rev_shard))
                p.hi = e
            return True
        yield from _refresh(c, gen)
        if not (yield _WSleep(c._backoff(attempt))):
            return False


def run_part(w: _WatchSpec, p: _Part) -> Plan[Optional[ShaleError]]:
    """Watch one part until the watch stops (None) or a terminal error,
    which it returns."""
    try:
        return (yield from _run_part(w, p))
    finally:
        w.part_started(p)


def _run_part(w: _WatchSpec, p: _Part) -> Plan[Optional[ShaleError]]:
    c = w.client
    nback = immediate = 0
    override = 0  # the node a leader hint named
    last_move = 0  # p.next after the last range change
    relogged = False  # a refused token was renewed since the last stream started
    avoid: Set[int] = set()
    rr = [random.getrandbits(32)]

    def backoff() -> _WSleep:
        nonlocal nback, immediate
        nback += 1
        immediate = 0
        return _WSleep(c._backoff(nback))

    while not w.stop.is_set():
        if not p.shard and not (yield from _resolve(w, p)):
            return None
        sh = c._rt.shard(p.shard)
        if sh is None:
            # The routing no longer knows the shard (merged away): the
            # part's range is elsewhere now.
            p.shard = 0
            if not (yield backoff()):
                return None
            continue
        node = override or _pick_replica(sh, True, avoid, rr)
        override = 0
        addr = c._rt.addr(node)
        if not node or not addr:
            yield from _refresh(c, -1)
            if not (yield backoff()):
                return None
            continue
        try:
            stubs = c._conn(addr)
        except ClientClosed as e:
            return e
        req = kv_pb2.WatchRequest(
            header=kv_pb2.RequestHeader(shard_id=p.shard),
            start_key=p.lo,
            end_key=p.hi,
            prev_kv=w.prev_kv,
            start_revision=p.next,
            progress_notify=w.progress,
        )
        if p.next:
            req.range_epoch = p.epoch
            req.revision_shard_id = p.rev_shard
        try:
            tok, issued = yield from c._token_plan(_deadline(c))
        except Unauthenticated as e:
            return e
        except ShaleError:
            if not (yield backoff()):
                return None
            continue
        md = _with_token([(_TARGET_NODE_KEY, str(node))], tok)
        moved, started, f = yield from _stream(w, p, stubs.kv.Watch, req, md)
        if started:
            # The replica served the stream: start afresh on trouble.
            nback = immediate = 0
            relogged = False
            avoid.clear()
        if moved is not None:
            # A split or merge moved part of the range: resolve it anew. The
            # refreshed routing may predate the change: the change's own
            # descriptor goes back in, and the same change met again (a
            # stale route sent the part back to it) waits a backoff.
            yield from _refresh(c, -1)
            c._rt.apply(moved)
            p.shard = 0
            again = p.next == last_move
            last_move = p.next
            if again and not (yield backoff()):
                return None
            continue
        if w.stop.is_set():
            return None
        if f is None:
            continue
        if c._auth is not None and not relogged and _rejected(f, tok):
            relogged = True
            try:
                yield from c._auth.renew(issued, _deadline(c))
            except ShaleError as e:
                return e
            continue
        if f.wrong_node:
            c._retire(addr, stubs)
        hint, terminal = yield from _classify(w, f, p, node, avoid)
        if terminal is not None:
            return terminal
        if hint and immediate < _MAX_IMMEDIATE:
            immediate += 1
            override = hint
        elif not hint and immediate < _MAX_IMMEDIATE and f.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            immediate += 1  # dropped as too slow: resume at once
        elif not (yield backoff()):
            return None
    return None


def _stream(
    w: _WatchSpec, p: _Part, method: Any, req: kv_pb2.WatchRequest, md: List[Tuple[str, str]]
) -> Plan[Tuple[Optional[meta_pb2.ShardDescriptor], bool, Optional[_Failure]]]:
    """Run one Watch stream of p: (the shard's descriptor when the stream
    ended with a range change, whether the replica accepted the stream, the
    failure that ended it otherwise)."""
    started = False
    try:
        st = yield _Open(method, req, md)
        while True:
            m = yield _Recv(st)
            if m is None:
                return None, started, _Failure(grpc.StatusCode.UNKNOWN, "the watch stream ended")
            rev = int(m.header.revision)
            if not started:
                started = True
                if not p.next:
                    p.next = rev + 1
                log.debug(
                    "shale client: watch stream of shard %d started on node %d at revision %d (next %d)",
                    p.shard,
                    m.header.node_id,
                    rev,
                    p.next,
                )
                p.rev_shard = p.shard
                w.part_started(p)
                continue
            rc = m.range_change if m.HasField("range_change") else None
            if m.events or (w.progress and rc is None):
                resp = WatchResponse(shard_id=p.shard, revision=rev, events=[WatchEvent.from_proto(e) for e in m.events])
                if not (yield _Emit(resp)):
                    return None, started, None
            if rev + 1 > p.next:
                p.next = rev + 1
            if rc is not None:
                return rc, started, None
    except grpc.RpcError as e:
        return None, started, _Failure.of(e)
    except _ClosedChannel as e:
        return None, started, _Failure(grpc.StatusCode.UNAVAILABLE, f"channel closed: {e}", sent=False)


def _classify(w: _WatchSpec, f: _Failure, p: _Part, node: int, avoid: Set[int]) -> Plan[Tuple[int, Optional[ShaleError]]]:
    """What a failure ending a stream means: end the watch (terminal), or
    retry, on the leader a hint named (hint) or, after a backoff, on another
    replica."""
    c = w.client
    if c._closed.is_set():
        return 0, ClientClosed("client closed", op="watch")
    log.debug("shale client: watch stream of shard %d on node %d ended (next %d): %s %s", p.shard, node, p.next, f.code, f.message)
    wi: Optional[meta_pb2.WatchInterrupted] = None
    for d in f.details:
        if isinstance(d, meta_pb2.WatchInterrupted):
            wi = d
    if wi is not None and wi.resume_revision > p.next:
        p.next = int(wi.resume_revision)
    code = f.code
    if code == grpc.StatusCode.OUT_OF_RANGE and wi is not None:
        return 0, Compacted(
            f"watch [{p.lo!r}, {p.hi!r}) on shard {p.shard} from revision {p.next}: revision compacted "
            f"(the oldest revision available is {wi.compact_revision}): {f.message}",
            shard_id=p.shard,
            revision=p.next,
            compact_revision=int(wi.compact_revision),
            code=code,
            details=f.details,
            op="watch",
        )
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        # Malformed, not allowed (or no longer: a revoked permission ends
        # the stream), or credentials refused even after a new login:
        # waiting cures none of them.
        return 0, f.typed("watch")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and wi is not None:
        return 0, None  # too slow: resume (at once, see run_part)
    if f.not_leader is not None:
        avoid.add(node)
        h = int(f.not_leader.leader_node_id)
        if h and h != node:
            c._rt.set_addr(h, f.not_leader.leader_address)
            c._rt.set_leader(p.shard, h)
            avoid.discard(h)  # fresh news of it
            return h, None
        return 0, None
    if f.outside is not None or f.epoch is not None or f.not_found is not None:
        avoid.add(node)
        if f.epoch is not None and f.epoch.HasField("current"):
            c._rt.apply(f.epoch.current)
        if f.outside is not None and f.outside.HasField("shard"):
            c._rt.apply(f.outside.shard)
        yield from _refresh(c, -1)
        if f.outside is not None:
            p.shard = 0  # the shard no longer holds the part
        return 0, None
    # Unavailable, a lost connection, a stopping node: try another replica.
    avoid.add(node)
    sh = c._rt.shard(p.shard)
    if sh is not None:
        Routing.clear_leader(sh, node)
    return 0, None


def watch_spec(
    client: _Base,
    start: Any,
    end: Any,
    prefix: Any,
    start_revision: Optional[int],
    prev_kv: bool,
    progress_notify: bool,
) -> _WatchSpec:
    """Check a watch's arguments (InvalidArgument at once) and make its spec."""
    lo, hi = _scan_range(start, end, prefix, "watch")
    if start_revision is not None and start_revision < 0:
        raise InvalidArgument(f"negative start_revision {start_revision}", op="watch")
    if client._closed.is_set():
        raise ClientClosed("client closed", op="watch")
    return _WatchSpec(client, lo, hi, prev_kv, progress_notify, start_revision or 0)
