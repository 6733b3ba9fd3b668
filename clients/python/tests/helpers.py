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
