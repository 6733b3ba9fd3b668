"""Helpers of the Python SDK's tests: a recorder of the client's RPCs that
can inject faults (Wire, and its fixture ``wire``), a fake gRPC error,
Admin calls (split, merge, leader transfer, a shard's leader) and the
control of the cluster's nodes (restart, kill, start)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc
import pytest

from shale.client import Client


class FakeRpcError(grpc.RpcError):
    """A gRPC error as a failed unary call raises it (without details)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self._code = code
        self._message = message

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> Tuple[Tuple[str, bytes], ...]:
        return ()


#: What gRPC says of a call that found no connection: it never left.
NOT_SENT = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused (simulated)"


class Wire:
    """Records (and can fault) every RPC a client sends: Client._send, the
    one place the client hands a request to gRPC, is wrapped.

    ``fault(request, send)`` decides each call: return send() to pass it
    on, raise to fail it (after or without sending it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: List[Tuple[str, Any, Dict[str, str]]] = []
        self.fault: Optional[Callable[[Any, Callable[[], Any]], Any]] = None
        real = Client._send
        wire = self

        def send(self: Client, method: Any, request: Any, timeout: Any, md: Any) -> Any:
            wire.calls.append((type(request).__name__, request, dict(md or [])))
            go = lambda: real(self, method, request, timeout, md)  # noqa: E731
            if wire.fault is not None:
                return wire.fault(request, go)
            return go()

        monkeypatch.setattr(Client, "_send", send)

    def sent(self, kind: str) -> List[Any]:
        """The requests of one type (``"PutRequest"``, ...) sent so far."""
        return [r for k, r, _ in self.calls if k == kind]

    def targets(self, kind: str) -> List[str]:
        """The node each request of one type was addressed to (shale-target-node-id)."""
        return [md.get("shale-target-node-id", "") for k, _, md in self.calls if k == kind]


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Wire:
    """A Wire recording the RPCs of every client of the test."""
    return Wire(monkeypatch)


def _admin_call(c: Client, what: str, call: Callable[[Any], Any], tries: int = 40) -> Any:
    """Send an Admin request (call(stub)) to the endpoints in turn until one
    succeeds, retrying while the cluster is busy (a leader moving, a split
    settling); AssertionError with the last error after tries rounds."""
    import time

    last: Optional[BaseException] = None
    for _ in range(tries):
        for addr in c.endpoints:
            try:
                return call(c._conn(addr).admin)
            except grpc.RpcError as e:
                last = e
        time.sleep(0.25)
    raise AssertionError(f"{what}: {last}")


def split_shard(c: Client, key: bytes) -> Tuple[int, int]:
    """Split the shard holding key at key (Admin.SplitShard, retried while
    the cluster is busy); returns the (left, right) shard IDs."""
    from shale.v1 import admin_pb2

    r = _admin_call(c, f"split at {key!r}", lambda a: a.SplitShard(admin_pb2.SplitShardRequest(split_key=key), timeout=20))
    return int(r.left.shard_id), int(r.right.shard_id)


def merge_shards(c: Client, key: bytes) -> Tuple[int, int]:
    """Merge the shard holding key with its right neighbour
    (Admin.MergeShards, retried while the cluster is busy); returns the
    (merged, removed) shard IDs."""
    from shale.v1 import admin_pb2

    r = _admin_call(c, f"merge at {key!r}", lambda a: a.MergeShards(admin_pb2.MergeShardsRequest(key=key), timeout=30))
    return int(r.merged.shard_id), int(r.removed_shard_id)


def transfer_leader(c: Client, shard_id: int, node_id: int) -> None:
    """Move shard_id's leadership to node_id (Admin.TransferLeader, retried
    while the cluster is busy)."""
    from shale.v1 import admin_pb2

    req = admin_pb2.TransferLeaderRequest(shard_id=shard_id, target_node_id=node_id)
    _admin_call(c, f"transfer of shard {shard_id} to node {node_id}", lambda a: a.TransferLeader(req, timeout=20))


def shard_leader(c: Client, key: bytes, timeout: float = 30, not_node: int = 0) -> Tuple[int, int, List[int]]:
    """The shard holding key, the node leading it as that node itself
    reports it (Client.cluster_status; a leader other than not_node), and
    the nodes of its replicas: (shard ID, leader, replica nodes). Polls
    until such a leader is reported; AssertionError after timeout."""
    import time

    end = time.monotonic() + timeout
    seen = ""
    while True:
        st = c.cluster_status()
        for s in st.shards:
            d = s.descriptor
            if d.system or d.merging_into or not (d.start_key <= key and (not d.end_key or key < d.end_key)):
                continue
            seen = f"shard {d.shard_id}: leader {s.leader_node_id} as reported by node {s.reported_by}"
            if s.leader_node_id and s.leader_node_id == s.reported_by and s.leader_node_id != not_node:
                return int(d.shard_id), int(s.leader_node_id), [int(r.node_id) for r in d.replicas]
        if time.monotonic() > end:
            raise AssertionError(f"no leader of the shard holding {key!r} reports itself: {seen or 'no such shard'}")
        time.sleep(0.1)


def _control(action: str, node_id: int, query: str = "") -> None:
    """Ask the harness to act on node node_id (see restart_node)."""
    import os
    import subprocess
    import urllib.request

    url = os.environ.get("SHALE_TEST_CONTROL", "")
    env = {"restart": "SHALE_TEST_RESTART_COMMAND", "kill": "SHALE_TEST_STOP_COMMAND", "start": "SHALE_TEST_START_COMMAND"}[action]
    cmd = os.environ.get(env, "")
    if url:
        req = urllib.request.Request(f"{url}/{action}?node={node_id}{query}", method="POST")
        with urllib.request.urlopen(req, timeout=90) as resp:
            assert resp.status == 200, resp.read()
    elif cmd:
        subprocess.run(cmd.replace("{node}", str(node_id)), shell=True, check=True, timeout=90)
    else:
        pytest.fail(f"no way to {action} a node: set SHALE_TEST_CONTROL or {env}")


def restart_node(node_id: int, kill: bool = False) -> None:
    """Stop node node_id (SIGTERM; SIGKILL with kill, which leaves its
    streams no goodbye) and start it again, waiting until it listens:
    through the test harness's control URL (SHALE_TEST_CONTROL, set by
    internal/proctest's TestPythonSDK), or a shell command
    (SHALE_TEST_RESTART_COMMAND, with {node} replaced, e.g.
    ``scripts/run-cluster.sh restart {node}`` against `make run`, which
    always stops with SIGTERM)."""
    _control("restart", node_id, f"&kill={int(kill)}")


def kill_node(node_id: int) -> None:
    """SIGKILL node node_id and wait until it has exited, leaving it down:
    through SHALE_TEST_CONTROL, or a shell command (SHALE_TEST_STOP_COMMAND,
    e.g. ``scripts/run-cluster.sh stop {node}``, a SIGTERM)."""
    _control("kill", node_id)


def start_node(node_id: int) -> None:
    """Start node node_id, stopped by kill_node, from its data, waiting
    until it listens: through SHALE_TEST_CONTROL, or a shell command
    (SHALE_TEST_START_COMMAND, e.g. ``scripts/run-cluster.sh start {node}``)."""
    _control("start", node_id)
