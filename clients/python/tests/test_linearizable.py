"""A porcupine-free linearizability smoke: concurrent writers and readers of
both clients (and two synchronous clients with routing caches of their
own) on a few keys of two shards, while the shards' leadership moves from
node to node; per key, no read goes back in time (tests/workload.py)."""

from __future__ import annotations

import time
from typing import Dict, List

import shale
from tests.helpers import shard_leader, transfer_leader
from tests.workload import Op, Worker, Workload, run_workload


def test_reads_never_go_back_in_time(endpoints: List[str]) -> None:
    # Two shards of the test cluster: [g, n) and [n, t).
    stamp = time.monotonic_ns()
    left, right = b"lz/%d/" % stamp, b"pz/%d/" % stamp
    workers: Dict[str, Worker] = {}
    for i, cl in enumerate(["sync", "sync", "aio", "aio"]):
        workers[f"{cl}-writer-{i}"] = (cl, "write", [left + b"%d" % i, right + b"%d" % i])
    keys = sorted(k for _, _, ks in workers.values() for k in ks)
    workers["sync-reader"] = ("sync-2", shale.Consistency.LINEARIZABLE, keys)
    workers["sync-reader-2"] = ("sync", shale.Consistency.LINEARIZABLE, keys)
    workers["sync-follower-reader"] = ("sync-2", shale.Consistency.FOLLOWER, keys)
    workers["sync-multi-reader"] = ("sync-2", "multi", keys)
    workers["aio-reader"] = ("aio", shale.Consistency.LINEARIZABLE, keys)
    workers["aio-follower-reader"] = ("aio", shale.Consistency.FOLLOWER, keys)
    workers["aio-multi-reader"] = ("aio", "multi", keys)
    names = list(workers)
    moves: List[int] = []

    def faults(wl: Workload, c: shale.Client) -> None:
        wl.wait_acks(0, names, 10, 30)
        for _ in range(3):
            for pre in (left, right):
                shard, leader, replicas = shard_leader(c, pre)
                target = next(n for n in replicas if n != leader)
                transfer_leader(c, shard, target)
                moves.append(target)
                wl.wait_acks(time.monotonic(), names, 5, 30)

    wl = run_workload(endpoints, 10.0, workers, faults)
    assert len(moves) == 6
    reads = sum(1 for op in wl.ops if not op.write)
    assert reads > 300, reads
    # The moves reached the calls: attempts failed and were retried.
    assert sum(wl.retried.values()) > 0, wl.retried


def test_the_check_sees_reads_back_in_time_and_from_the_future() -> None:
    def check(*ops: Op) -> str:
        wl = Workload(10)
        wl.ops = list(ops)
        try:
            wl.check_history()
        except AssertionError as e:
            return str(e)
        return ""

    k = b"k"
    w1, w2 = Op("w", True, k, 1, 0, 1), Op("w", True, k, 2, 2, 3)
    # Reads during a write may see either value; after it, only the new one.
    assert check(w1, w2, Op("a", False, k, 1, 2.5, 2.6), Op("b", False, k, 2, 2.4, 2.7), Op("c", False, k, 2, 4, 5)) == ""
    assert "went back in time" in check(w1, w2, Op("a", False, k, 1, 4, 5))
    # A read that ended before another started bounds it too.
    assert "by a of 2" in check(w1, w2, Op("a", False, k, 2, 2.1, 2.2), Op("b", False, k, 1, 2.3, 2.4))
    # A value whose write had not started.
    assert "never written before" in check(w1, w2, Op("a", False, k, 2, 1.0, 1.5))
    assert "never written before" in check(w1, Op("a", False, k, 7, 1.0, 1.5))
    # The absent key (0) before the first write.
    assert check(Op("a", False, k, 0, 0, 0.5), w1) == ""
    assert "went back in time" in check(w1, Op("a", False, k, 0, 2, 3))
