"""TLS and user/password authentication against a real cluster."""

from __future__ import annotations

import time
from typing import Dict, List

import grpc
import pytest

import shale
from tests.helpers import Wire


def test_root_over_tls_with_a_token(root: shale.Client, wire: Wire) -> None:
    wire.calls.clear()
    root.put(b"k", b"v")
    kv = root.get(b"k")
    assert kv is not None and kv.value == b"v"
    assert [kv.key for kv in root.scan()] == [b"k"]
    assert root.txn().compare(shale.Value(b"k") == b"v").then(shale.Delete(b"k")).commit().succeeded
    assert len(root.cluster_status().nodes) == 3
    # Every call carried the token.
    assert wire.calls and all(md.get("authorization", "").startswith("Bearer ") for _, _, md in wire.calls)


def test_wrong_password_is_unauthenticated_at_once(endpoints: List[str], tls: shale.TLSConfig) -> None:
    t0 = time.monotonic()
    with pytest.raises(shale.Unauthenticated) as ei:
        shale.Client(endpoints, tls=tls, user="root", password="wrong", timeout=30)
    assert time.monotonic() - t0 < 5
    assert ei.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_no_credentials_is_unauthenticated_at_once(endpoints: List[str], tls: shale.TLSConfig) -> None:
    t0 = time.monotonic()
    with pytest.raises(shale.Unauthenticated):
        shale.Client(endpoints, tls=tls, timeout=30)
    assert time.monotonic() - t0 < 5


def test_permission_denied_is_not_retried(
    endpoints: List[str], tls: shale.TLSConfig, env: Dict[str, str], wire: Wire
) -> None:
    with shale.Client(endpoints, tls=tls, user="alice", password=env["SHALE_ALICE_PASSWORD"]) as alice:
        alice.put(b"alice/1", b"mine")
        kv = alice.get(b"alice/1")
        assert kv is not None and kv.value == b"mine"
        assert [kv.key for kv in alice.scan(prefix=b"alice/")] == [b"alice/1"]
        wire.calls.clear()
        with pytest.raises(shale.PermissionDenied) as ei:
            alice.put(b"bob/1", b"not mine")
        assert not isinstance(ei.value, shale.OutcomeUnknown)
        assert len(wire.sent("PutRequest")) == 1
        with pytest.raises(shale.PermissionDenied):
            alice.get(b"bob/1")
        with pytest.raises(shale.PermissionDenied):
            list(alice.scan())  # the whole key space: more than alice may read
        with pytest.raises(shale.PermissionDenied):
            alice.cluster_status()  # needs the role root


def test_refused_token_is_renewed_and_the_call_resent(root: shale.Client, wire: Wire) -> None:
    auth = root._auth
    assert auth is not None and auth.token
    auth.token = auth.token[:-4] + "AAAA"  # a token no node accepts
    wire.calls.clear()
    root.put(b"renewed", b"v")
    kinds = [k for k, _, _ in wire.calls]
    assert kinds == ["PutRequest", "AuthenticateRequest", "PutRequest"], kinds
    kv = root.get(b"renewed")
    assert kv is not None and kv.version == 1


def test_plaintext_to_a_tls_cluster_is_unauthenticated_at_once(endpoints: List[str]) -> None:
    # The node answers plaintext on its TLS port only to say that it needs TLS.
    t0 = time.monotonic()
    with pytest.raises(shale.Unauthenticated, match="requires TLS"):
        shale.Client(endpoints, timeout=30)
    assert time.monotonic() - t0 < 5


def test_certificate_of_another_ca_fails_at_once(endpoints: List[str], env: Dict[str, str]) -> None:
    t0 = time.monotonic()
    with pytest.raises(shale.Unavailable, match="security") as ei:
        shale.Client(endpoints, tls=shale.TLSConfig(ca_file=env["SHALE_TLS_OTHER_CA"]), timeout=30)
    assert not isinstance(ei.value, shale.DeadlineExceeded)
    assert time.monotonic() - t0 < 5
    with pytest.raises(shale.InvalidArgument):
        shale.Client(endpoints, tls=shale.TLSConfig(ca_file="/nonexistent/ca.crt"))


def test_watch_with_a_token_and_permissions(endpoints: List[str], tls: shale.TLSConfig, env: Dict[str, str]) -> None:
    with shale.Client(endpoints, tls=tls, user="alice", password=env["SHALE_ALICE_PASSWORD"]) as alice:
        with alice.watch(prefix=b"alice/") as w:
            assert w.wait_started(30)
            r = alice.put(b"alice/w", b"1")
            ev = next(w.events())
        assert ev.kv.key == b"alice/w" and ev.kv.mod_revision == r.revision
        # Outside alice's roles: the watch ends with PermissionDenied, not retried.
        with pytest.raises(shale.PermissionDenied):
            with alice.watch(prefix=b"bob/") as w2:
                next(w2)


def test_asyncio_client_over_tls_with_a_token(endpoints: List[str], tls: shale.TLSConfig, env: Dict[str, str]) -> None:
    import asyncio

    import shale.aio

    async def main() -> None:
        async with shale.aio.Client(endpoints, tls=tls, user="alice", password=env["SHALE_ALICE_PASSWORD"]) as c:
            await c.put(b"alice/aio", b"1")
            kv = await c.get(b"alice/aio")
            assert kv is not None and kv.value == b"1"
            with pytest.raises(shale.PermissionDenied):
                await c.get(b"bob/1")
        with pytest.raises(shale.Unauthenticated):
            async with shale.aio.Client(endpoints, tls=tls, user="alice", password="wrong"):
                pass

    asyncio.run(main())
