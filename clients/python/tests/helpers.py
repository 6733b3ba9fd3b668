"""Helpers of the Python SDK's tests: a recorder of the client's RPCs that
can inject faults (Wire, and its fixture ``wire``) and a fake gRPC error."""

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


def split_shard(c: Client, key: bytes) -> Tuple[int, int]:
    """Split the shard holding key at key (Admin.SplitShard, retried while
    the cluster is busy); returns the (left, right) shard IDs."""
    import time

    from shale.v1 import admin_pb2

    last: Optional[BaseException] = None
    for _ in range(40):
        for addr in c.endpoints:
            try:
                r = c._conn(addr).admin.SplitShard(admin_pb2.SplitShardRequest(split_key=key), timeout=20)
                return int(r.left.shard_id), int(r.right.shard_id)
            except grpc.RpcError as e:
                last = e
        time.sleep(0.25)
    raise AssertionError(f"split at {key!r}: {last}")


def restart_node(node_id: int, kill: bool = False) -> None:
    """Stop node node_id (SIGTERM; SIGKILL with kill, which leaves its
    streams no goodbye) and start it again, waiting until it listens:
    through the test harness's control URL (SHALE_TEST_CONTROL, set by
    internal/proctest's TestPythonSDK), or a shell command
    (SHALE_TEST_RESTART_COMMAND, with {node} replaced, e.g.
    ``scripts/run-cluster.sh restart {node}`` against `make run`, which
    always stops with SIGTERM)."""
    import os
    import subprocess
    import urllib.request

    url = os.environ.get("SHALE_TEST_CONTROL", "")
    cmd = os.environ.get("SHALE_TEST_RESTART_COMMAND", "")
    if url:
        req = urllib.request.Request(f"{url}/restart?node={node_id}&kill={int(kill)}", method="POST")
        with urllib.request.urlopen(req, timeout=90) as resp:
            assert resp.status == 200, resp.read()
    elif cmd:
        subprocess.run(cmd.replace("{node}", str(node_id)), shell=True, check=True, timeout=90)
    else:
        pytest.fail("no way to restart a node: set SHALE_TEST_CONTROL or SHALE_TEST_RESTART_COMMAND")
