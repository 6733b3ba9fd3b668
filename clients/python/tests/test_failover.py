"""A shard's leader killed (SIGKILL) in the middle of a workload of both
clients, and started again: no exception the docs call retried reaches a
caller, every acknowledged write is there afterwards, and no read goes back
in time (tests/workload.py)."""

from __future__ import annotations

import time
from typing import Dict, List

import pytest

import shale
from tests.helpers import kill_node, shard_leader, start_node, transfer_leader
from tests.workload import Worker, Workload, run_workload


@pytest.mark.parametrize("timeout", [20.0, 0.8], ids=["deadline-20s", "deadline-0.8s"])
def test_leader_kill_mid_workload(endpoints: List[str], timeout: float) -> None:
    """With a 20 s deadline, well past a failover (the test cluster elects a
    new leader within about a second), no exception reaches a caller at
    all. With 0.8 s, calls in flight at the kill reach their deadline: only
    there may DeadlineExceeded (a read, or a write ruled out, which must not
    have applied) and OutcomeUnknown (settled by sending the write again
    with its request ID) reach the caller."""
    # One shard ([g, n) of the test cluster) holds every key, so the kill
    # takes the leader of all of them.
    pre = b"kf/%d/" % time.monotonic_ns()
    workers: Dict[str, Worker] = {}
    for i in range(4):
        workers[f"sync-writer-{i}"] = ("sync", "write", [pre + b"s%d/%d" % (i, j) for j in range(2)])
    for i in range(3):
        workers[f"aio-writer-{i}"] = ("aio", "write", [pre + b"a%d/%d" % (i, j) for j in range(2)])
    keys = sorted(k for _, what, ks in workers.values() if what == "write" for k in ks)
    workers["sync-reader"] = ("sync", shale.Consistency.LINEARIZABLE, keys)
    workers["sync-follower-reader"] = ("sync-2", shale.Consistency.FOLLOWER, keys)
    workers["aio-reader"] = ("aio", shale.Consistency.LINEARIZABLE, keys)
    workers["aio-multi-reader"] = ("aio", "multi", keys)
    names = list(workers)
    seen: Dict[str, int] = {}

    def faults(wl: Workload, c: shale.Client) -> None:
        wl.wait_acks(0, names, 20, 30)
        shard, leader, _ = shard_leader(c, pre)
        assert all(shard_leader(c, k)[0] == shard for k in keys)
        killed = time.monotonic()
        kill_node(leader)
        try:
            # The workload goes on on the two nodes left...
            wl.wait_acks(killed, names, 10, 30)
            seen["new leader"] = shard_leader(c, pre, not_node=leader)[1]
        finally:
            start_node(leader)
        # ... and with the killed node back, leading the shard again.
        transfer_leader(c, shard, leader)
        wl.wait_acks(time.monotonic(), names, 10, 30)
        seen["leader"] = leader

    wl = run_workload(endpoints, timeout, workers, faults)
    assert seen["new leader"] != seen["leader"]
    assert len(wl.ops) > 200, len(wl.ops)
    # The kill reached the calls: attempts failed and were retried.
    assert sum(wl.retried.values()) > 0, wl.retried
    if timeout >= 10:
        assert not wl.at_deadline, wl.at_deadline[:5]
