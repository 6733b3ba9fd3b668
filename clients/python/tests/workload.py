"""A concurrent workload for the fault and linearizability tests, run by
the synchronous client (calls on a pool of threads) and the asyncio one
(tasks) at once, and the checks of its history.

Writers each own a few keys and write each key's counter 1, 2, 3, ... in
turn with put, cas and a transaction; so every write's effect is known
exactly, a cas or compare that fails is a lost (or phantom) write, and each
owner reads its own key back after each write. Readers read every key over
and over (get, a follower read, multi_get). Every operation is recorded
with its start and end on the monotonic clock, which all threads share.

Which exceptions may reach the caller is docs/python.md's rule: retried
failures never do; at the call's deadline, DeadlineExceeded (a read or a
write ruled out) or OutcomeUnknown (a write that may have applied, settled
here as the docs say, by sending the same write again with its request
ID). Anything else, or those before the deadline, breaks the contract and
is reported by ``check_contract``.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import concurrent.futures
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Coroutine, Dict, List, Optional, Sequence, Tuple

import shale
import shale.aio

#: How early before its deadline a call may end with DeadlineExceeded or
#: OutcomeUnknown (gRPC may end an attempt a moment before the clock
#: reaches the deadline).
DEADLINE_SLACK = 0.25
#: How long a writer keeps sending a write whose outcome is unknown again
#: (with its request ID) before it calls that a breach.
SETTLE_WITHIN = 60.0


@dataclass
class Op:
    """One operation on one key: a write of counter value (acknowledged, or
    settled as applied) or a read that saw value (0: the key was absent)."""

    who: str
    write: bool
    key: bytes
    value: int
    start: float
    end: float


class Api:
    """The calls the workload makes, awaitable for both clients."""

    name = ""

    async def put(self, key: bytes, value: bytes, prev_kv: bool, rid: Optional[bytes]) -> shale.PutResult:
        raise NotImplementedError

    async def cas(self, key: bytes, old: bytes, new: bytes, rid: Optional[bytes]) -> shale.CasResult:
        raise NotImplementedError

    async def txn(self, key: bytes, old: Optional[bytes], new: bytes, rid: Optional[bytes]) -> shale.TxnResult:
        """If key's value is old (absent: None), put new and get the key
        back; else get it."""
        raise NotImplementedError

    async def get(self, key: bytes, consistency: str) -> Optional[shale.KeyValue]:
        raise NotImplementedError

    async def multi_get(self, keys: Sequence[bytes]) -> List[Optional[shale.KeyValue]]:
        raise NotImplementedError


class SyncApi(Api):
    """shale.Client's calls, each run on a thread of a pool."""

    def __init__(self, c: shale.Client, pool: concurrent.futures.ThreadPoolExecutor) -> None:
        self.c = c
        self.pool = pool
        self.name = "sync"

    async def _run(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn)

    async def put(self, key: bytes, value: bytes, prev_kv: bool, rid: Optional[bytes]) -> shale.PutResult:
        r: shale.PutResult = await self._run(lambda: self.c.put(key, value, prev_kv=prev_kv, request_id=rid))
        return r

    async def cas(self, key: bytes, old: bytes, new: bytes, rid: Optional[bytes]) -> shale.CasResult:
        r: shale.CasResult = await self._run(lambda: self.c.cas(key, old, new, request_id=rid))
        return r

    async def txn(self, key: bytes, old: Optional[bytes], new: bytes, rid: Optional[bytes]) -> shale.TxnResult:
        cmp = shale.key_missing(key) if old is None else shale.Value(key).equal(old)
        t = self.c.txn().compare(cmp).then(shale.Put(key, new), shale.Get(key)).else_(shale.Get(key))
        r: shale.TxnResult = await self._run(lambda: t.commit(request_id=rid))
        return r

    async def get(self, key: bytes, consistency: str) -> Optional[shale.KeyValue]:
        r: Optional[shale.KeyValue] = await self._run(lambda: self.c.get(key, consistency=consistency))
        return r

    async def multi_get(self, keys: Sequence[bytes]) -> List[Optional[shale.KeyValue]]:
        r: List[Optional[shale.KeyValue]] = await self._run(lambda: self.c.multi_get(keys))
        return r


class AioApi(Api):
    """shale.aio.Client's calls."""

    def __init__(self, c: shale.aio.Client) -> None:
        self.c = c
        self.name = "aio"

    async def put(self, key: bytes, value: bytes, prev_kv: bool, rid: Optional[bytes]) -> shale.PutResult:
        return await self.c.put(key, value, prev_kv=prev_kv, request_id=rid)

    async def cas(self, key: bytes, old: bytes, new: bytes, rid: Optional[bytes]) -> shale.CasResult:
        return await self.c.cas(key, old, new, request_id=rid)

    async def txn(self, key: bytes, old: Optional[bytes], new: bytes, rid: Optional[bytes]) -> shale.TxnResult:
        cmp = shale.key_missing(key) if old is None else shale.Value(key).equal(old)
        t = self.c.txn().compare(cmp).then(shale.Put(key, new), shale.Get(key)).else_(shale.Get(key))
        return await t.commit(request_id=rid)

    async def get(self, key: bytes, consistency: str) -> Optional[shale.KeyValue]:
        return await self.c.get(key, consistency=consistency)

    async def multi_get(self, keys: Sequence[bytes]) -> List[Optional[shale.KeyValue]]:
        return await self.c.multi_get(keys)


def _num(kv: Optional[shale.KeyValue]) -> int:
    return 0 if kv is None else int(kv.value)


class _FailedAttempts(logging.Handler):
    """Counts the client's failed attempts (its debug log "... attempt N on
    shard S node X failed: CODE ..."), by status code."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.codes: Dict[str, int] = {}
        self.mu2 = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if "attempt %d on shard %d node %d failed" in str(record.msg):
            code = str(record.args[4]) if isinstance(record.args, tuple) and len(record.args) > 4 else "?"
            with self.mu2:
                self.codes[code] = self.codes.get(code, 0) + 1


class Workload:
    """The shared record of a run: its history, the acknowledgements of
    each worker, and the contract's breaches."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.mu = threading.Lock()
        self.ops: List[Op] = []
        self.breaches: List[str] = []  # exceptions the caller must not see
        self.at_deadline: List[str] = []  # DeadlineExceeded / OutcomeUnknown at the deadline
        self.unknown = 0  # writes settled after OutcomeUnknown
        self.acked: Dict[str, List[float]] = {}  # worker: start of each acknowledged op
        self.model: Dict[bytes, int] = {}  # key: its owner's last known value
        self.stop = threading.Event()
        #: The attempts that failed and were retried, by status code.
        self.retried: Dict[str, int] = {}

    def record(self, op: Op) -> None:
        with self.mu:
            self.ops.append(op)
            self.acked.setdefault(op.who, []).append(op.start)

    def breach(self, msg: str) -> None:
        with self.mu:
            self.breaches.append(msg)

    def escaped(self, who: str, what: str, e: BaseException, start: float) -> bool:
        """Judge an exception a call raised: True when the docs let it reach
        the caller (at the deadline), else recorded as a breach."""
        took = time.monotonic() - start
        msg = f"{who}: {what}: {type(e).__name__} after {took:.2f}s: {e}"
        if isinstance(e, (shale.OutcomeUnknown, shale.DeadlineExceeded)) and took >= self.timeout - DEADLINE_SLACK:
            with self.mu:
                self.at_deadline.append(msg)
            return True
        self.breach(msg)
        return False

    def acks_since(self, t: float) -> Dict[str, int]:
        """Per worker, its operations that started after t and were acknowledged."""
        with self.mu:
            return {w: len(ts) - bisect.bisect_right(sorted(ts), t) for w, ts in self.acked.items()}

    def wait_acks(self, since: float, workers: Sequence[str], n: int, timeout: float) -> None:
        """Wait until each worker has n acknowledged operations that started
        after since; AssertionError naming the laggards after timeout."""
        end = time.monotonic() + timeout
        while True:
            got = self.acks_since(since)
            short = {w: got.get(w, 0) for w in workers if got.get(w, 0) < n}
            with self.mu:
                breaches = list(self.breaches)
            assert not breaches, "\n".join(breaches[:10])
            if not short:
                return
            assert time.monotonic() < end, f"within {timeout}s, fewer than {n} operations acknowledged by {short}"
            time.sleep(0.02)

    # -- workers --

    async def writer(self, api: Api, who: str, keys: Sequence[bytes]) -> None:
        """Write each key's next counter in turn (put, cas, txn, put with
        prev_kv), reading it back after each write, until stopped."""
        for k in keys:
            self.model[k] = 0
        i = 0
        while not self.stop.is_set():
            k = keys[i % len(keys)]
            kind = (i // len(keys)) % 4
            i += 1
            old, new = self.model[k], self.model[k] + 1
            what = f"{('put', 'cas', 'txn', 'put prev_kv')[kind]} {k!r} {old}->{new}"
            start = time.monotonic()
            rid: Optional[bytes] = None
            while time.monotonic() - start < SETTLE_WITHIN:
                call = time.monotonic()
                try:
                    wrong = await self._write(api, kind, k, old, new, rid)
                    break
                except shale.OutcomeUnknown as e:
                    if not self.escaped(who, what, e, call):
                        return
                    # Settled as the docs say: the same write again with
                    # the same request ID applies at most once in all.
                    with self.mu:
                        self.unknown += 1
                    rid = e.request_id
                    continue
                except shale.ShaleError as e:
                    if not self.escaped(who, what, e, call):
                        return
                    # At the deadline, and ruled out: it did not apply.
                    if rid is None:
                        wrong, new = None, old
                        break
                    continue
            else:
                self.breach(f"{who}: {what}: unknown outcome not settled within {SETTLE_WITHIN}s")
                return
            if wrong:
                self.breach(f"{who}: {what}: {wrong} (the key has one writer)")
                return
            if new != old:
                self.record(Op(who, True, k, new, start, time.monotonic()))
                self.model[k] = new
            if not await self._read_back(api, who, k, new):
                return

    async def _write(self, api: Api, kind: int, k: bytes, old: int, new: int, rid: Optional[bytes]) -> Optional[str]:
        """Write k's counter from old to new the kind-th way; what was wrong
        with the answer, or None."""
        ob, nb = b"%d" % old, b"%d" % new
        if kind == 0 or (kind == 1 and old == 0):
            await api.put(k, nb, False, rid)
        elif kind == 1:
            cr = await api.cas(k, ob, nb, rid)
            if not cr.succeeded or _num(cr.current) != old:
                return f"succeeded={cr.succeeded}, current {cr.current}"
        elif kind == 2 and old == 0:
            # No value to compare with yet: a transaction creating the key.
            tr = await api.txn(k, None, nb, rid)
            if not tr.succeeded or _num(tr.results[-1].kv) != new:
                return f"succeeded={tr.succeeded}, results {tr.results}"
        elif kind == 2:
            tr = await api.txn(k, ob, nb, rid)
            if not tr.succeeded or _num(tr.results[-1].kv) != new:
                return f"succeeded={tr.succeeded}, results {tr.results}"
        else:
            pr = await api.put(k, nb, True, rid)
            if _num(pr.prev_kv) != old:
                return f"prev_kv {pr.prev_kv}"
        return None

    async def _read_back(self, api: Api, who: str, k: bytes, want: int) -> bool:
        """The owner's read of its key: it must see want (read your writes)."""
        start = time.monotonic()
        try:
            kv = await api.get(k, shale.Consistency.LINEARIZABLE)
        except shale.ShaleError as e:
            return self.escaped(who, f"get {k!r}", e, start)
        self.record(Op(who, False, k, _num(kv), start, time.monotonic()))
        if _num(kv) != want:
            self.breach(f"{who}: get {k!r} after its write of {want}: {kv}")
            return False
        return True

    async def reader(self, api: Api, who: str, keys: Sequence[bytes], consistency: str) -> None:
        """Read every key in turn until stopped: with get at consistency, or
        with multi_get when consistency is "multi"."""
        i = 0
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                if consistency == "multi":
                    kvs = await api.multi_get(keys)
                    end = time.monotonic()
                    for k, kv in zip(keys, kvs):
                        self.record(Op(who, False, k, _num(kv), start, end))
                    continue
                k = keys[i % len(keys)]
                i += 1
                kv = await api.get(k, consistency)
            except shale.ShaleError as e:
                if not self.escaped(who, f"{consistency} read", e, start):
                    return
                continue
            self.record(Op(who, False, k, _num(kv), start, time.monotonic()))

    # -- checks --

    def check_contract(self) -> None:
        """No exception reached a caller that the docs say it cannot see."""
        assert not self.breaches, f"{len(self.breaches)} breaches:\n" + "\n".join(self.breaches[:10])

    def check_history(self) -> int:
        """Reads never go back in time, per key: a read returns at least the
        newest value of every write acknowledged, and of every read
        finished, before it started; and never a value whose write had not
        started when it ended. Returns the number of reads checked."""
        by_key: Dict[bytes, List[Op]] = {}
        for op in self.ops:
            by_key.setdefault(op.key, []).append(op)
        bad: List[str] = []
        reads = 0
        for k, ops in by_key.items():
            # The newest value known to be in place by each end time.
            done = sorted(ops, key=lambda o: o.end)
            ends = [o.end for o in done]
            floor: List[Tuple[int, Op]] = []
            best: Tuple[int, Optional[Op]] = (0, None)
            for o in done:
                if o.value > best[0]:
                    best = (o.value, o)
                floor.append((best[0], best[1] or o))
            started = {o.value: o.start for o in ops if o.write}
            for r in ops:
                if r.write:
                    continue
                reads += 1
                j = bisect.bisect_left(ends, r.start) - 1
                if j >= 0 and r.value < floor[j][0]:
                    w = floor[j][1]
                    bad.append(
                        f"{k!r}: {r.who} read {r.value} in [{r.start:.3f}, {r.end:.3f}], but "
                        f"{'a write' if w.write else 'a read'} by {w.who} of {w.value} ended at {w.end:.3f}"
                    )
                if r.value and not (r.value in started and started[r.value] < r.end):
                    bad.append(f"{k!r}: {r.who} read {r.value} in [{r.start:.3f}, {r.end:.3f}], never written before")
        assert not bad, f"{len(bad)} reads went back in time or read the future:\n" + "\n".join(bad[:10])
        return reads

    def check_final(self, c: shale.Client) -> None:
        """Every key holds its owner's last acknowledged (or settled) value,
        and has been written exactly that many times (its version: each
        write adds one to the counter and to the version, so a retried write
        applied twice shows)."""
        keys = sorted(self.model)
        got = c.multi_get(keys)
        wrong = [(k, self.model[k], kv) for k, kv in zip(keys, got) if _num(kv) != self.model[k]]
        assert not wrong, f"keys not holding their last acknowledged value: {wrong[:5]}"
        twice = [(k, kv) for k, kv in zip(keys, got) if kv is not None and kv.version != _num(kv)]
        assert not twice, f"keys written more times than acknowledged (value, version): {twice[:5]}"


#: A worker: (its client, what it does, its keys). The client is "aio"
#: (one shale.aio.Client) or any other name (a shale.Client of that name,
#: called from a pool of threads); what it does is "write", or a read
#: consistency, or "multi" (multi_get of all its keys).
Worker = Tuple[str, str, List[bytes]]


def run_workload(
    endpoints: List[str],
    timeout: float,
    workers: Dict[str, Worker],
    faults: Callable[[Workload, shale.Client], None],
) -> Workload:
    """Run workers until faults(workload, client) returns (it runs in the
    calling thread, with a client of its own), then stop them and check
    that no exception reached a caller that the docs say it cannot see,
    that reads never went back in time, and that every key holds its last
    acknowledged value. Every call of the workers has the given timeout."""
    wl = Workload(timeout)
    clients: Dict[str, shale.Client] = {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(workers) + 2)

    async def main() -> None:
        async with shale.aio.Client(endpoints, timeout=timeout) as ac:
            apis: Dict[str, Api] = {"aio": AioApi(ac)}
            for name, c in clients.items():
                apis[name] = SyncApi(c, pool)
            jobs: List[Awaitable[None]] = []
            for who, (cl, what, keys) in workers.items():
                if what == "write":
                    jobs.append(wl.writer(apis[cl], who, keys))
                else:
                    jobs.append(wl.reader(apis[cl], who, keys, what))
            await asyncio.gather(*jobs)

    counter = _FailedAttempts()
    logger = logging.getLogger("shale")
    level = logger.level
    logger.addHandler(counter)
    logger.setLevel(logging.DEBUG)
    # The faults' and the checks' client waits for the cluster as long as it
    # takes (the workload's calls may have short deadlines).
    with shale.Client(endpoints, timeout=max(timeout, 10.0)) as ctl:
        try:
            for cl, _, _ in workers.values():
                if cl != "aio" and cl not in clients:
                    clients[cl] = shale.Client(endpoints, timeout=timeout)
            t = run_in_loop(main)
            try:
                faults(wl, ctl)
            finally:
                wl.stop.set()
                t.join(SETTLE_WITHIN + 2 * timeout + 10)
            assert not t.is_alive(), "the workload does not stop"
            assert getattr(t, "err") is None, f"the workload failed: {getattr(t, 'err')!r}"
        finally:
            logger.removeHandler(counter)
            logger.setLevel(level)
            pool.shutdown(wait=False)
            for c in clients.values():
                c.close()
        wl.retried = dict(counter.codes)
        writes = sum(1 for op in wl.ops if op.write)
        print(
            f"workload: {writes} writes and {len(wl.ops) - writes} reads acknowledged; "
            f"{wl.unknown} unknown outcomes settled; attempts retried: {wl.retried}; at the deadline: {wl.at_deadline[:5]}"
        )
        wl.check_contract()
        wl.check_history()
        wl.check_final(ctl)
    return wl


def run_in_loop(body: Callable[[], Coroutine[Any, Any, None]]) -> threading.Thread:
    """Run asyncio.run(body()) in a new thread (started); an exception ends
    up in the thread's ``err`` attribute."""

    def main() -> None:
        try:
            asyncio.run(body())
        except BaseException as e:  # noqa: BLE001 (checked by the caller)
            setattr(t, "err", e)

    t = threading.Thread(target=main, daemon=True)
    setattr(t, "err", None)
    t.start()
    return t
