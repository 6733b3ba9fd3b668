"""Bad input, retries, request IDs and unknown outcomes, against a real cluster.

Faults are injected at the client's wire (conftest.Wire): an attempt can be
sent for real and then fail as if its reply were lost, or fail as a call
that never found a connection.
"""

from __future__ import annotations

import os
import time

import grpc
import pytest

import shale
from tests.helpers import NOT_SENT, FakeRpcError, Wire


# -- bad input: the documented exception at once, never retried --------------


def test_empty_key_is_invalid_argument_at_once(client: shale.Client, wire: Wire) -> None:
    for call in (lambda: client.put(b"", b"v"), lambda: client.get(b""), lambda: client.delete(b""),
                 lambda: client.cas(b"", None, b"v")):
        wire.calls.clear()
        t0 = time.monotonic()
        with pytest.raises(shale.InvalidArgument) as ei:
            call()
        assert time.monotonic() - t0 < 1
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "empty" in ei.value.message
        assert len(wire.calls) == 1, "an InvalidArgument answer must not be retried"
        assert not isinstance(ei.value, shale.OutcomeUnknown)


def test_oversized_value_is_invalid_argument_at_once(client: shale.Client, wire: Wire) -> None:
    wire.calls.clear()
    with pytest.raises(shale.InvalidArgument) as ei:
        client.put(b"big", b"x" * ((1 << 20) + 1))  # the server's 1 MiB limit
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert len(wire.calls) == 1
    # Over the node's gRPC receive limit: RESOURCE_EXHAUSTED "message larger
    # than max", which retrying cannot cure.
    wire.calls.clear()
    with pytest.raises(shale.InvalidArgument) as ei:
        client.put(b"huge", b"x" * (10 << 20))
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in ei.value.message
    assert len(wire.calls) == 1
    assert client.get(b"big") is None and client.get(b"huge") is None


def test_inverted_range_is_invalid_argument_before_any_request(client: shale.Client, wire: Wire) -> None:
    wire.calls.clear()
    with pytest.raises(shale.InvalidArgument, match="start must be before end"):
        client.scan(b"b", b"a")  # raised by the call, not at the first next()
    with pytest.raises(shale.InvalidArgument):
        client.scan(b"a", b"a")
    with pytest.raises(shale.InvalidArgument):
        client.delete_range(b"m", b"c")
    with pytest.raises(shale.InvalidArgument):
        shale.DeleteRange(b"m", b"c")
    with pytest.raises(shale.InvalidArgument, match="prefix"):
        client.scan(b"a", None, prefix=b"p")
    with pytest.raises(shale.InvalidArgument):
        client.scan(limit=-1)
    assert wire.calls == []


def test_other_bad_input(client: shale.Client, wire: Wire) -> None:
    wire.calls.clear()
    with pytest.raises(shale.InvalidArgument, match="negative TTL"):
        client.put(b"k", b"v", ttl=-1)
    with pytest.raises(shale.InvalidArgument, match="request_id"):
        client.put(b"k", b"v", request_id=b"short")
    with pytest.raises(shale.InvalidArgument, match="request_id"):
        client.delete(b"k", request_id=b"x" * 33)
    with pytest.raises(shale.InvalidArgument, match="empty transaction"):
        client.txn().commit()
    with pytest.raises(shale.InvalidArgument):
        client.txn().then(b"not an op")  # type: ignore[arg-type]
    with pytest.raises(shale.InvalidArgument):
        shale.Version(b"k") == -1  # noqa: B015
    assert wire.calls == []
    assert client.get(b"k") is None


# -- request IDs: a retried write applies once -------------------------------


def lose_first_reply(kind: str):  # type: ignore[no-untyped-def]
    """A fault that sends the first request of a kind for real, then fails
    it as if the connection broke before the reply came."""
    state = {"n": 0}

    def fault(request, send):  # type: ignore[no-untyped-def]
        if type(request).__name__ != kind:
            return send()
        state["n"] += 1
        if state["n"] == 1:
            send()
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed (simulated: the reply was lost)")
        return send()

    return fault


def test_retried_put_applies_once(client: shale.Client, wire: Wire) -> None:
    wire.calls.clear()
    wire.fault = lose_first_reply("PutRequest")
    r = client.put(b"once", b"v")
    # The retry goes to another replica (the leader failed), which points
    # back at the leader: two or three attempts, all with one request ID.
    puts = wire.sent("PutRequest")
    assert len(puts) >= 2, "the put was retried"
    ids = {p.header.request_id for p in puts}
    assert len(ids) == 1 and len(ids.pop()) == shale.client.REQUEST_ID_LEN
    assert [p.header.first_attempt for p in puts] == [True] + [False] * (len(puts) - 1)
    kv = client.get(b"once")
    assert kv is not None and kv.version == 1, "the retried put applied twice"
    assert kv.mod_revision == r.revision


@pytest.mark.parametrize("kind,call,check", [
    ("DeleteRequest", lambda c: c.delete(b"once-d"), lambda r: r.deleted),
    # A second application would fail its comparison (the value is w by then).
    ("CompareAndSwapRequest", lambda c: c.cas(b"once-d", b"v", b"w"), lambda r: r.succeeded),
    ("TxnRequest", lambda c: c.txn().compare(shale.Version(b"once-d") == 1).then(shale.Put(b"once-d", b"t")).commit(),
     lambda r: r.succeeded),
])
def test_retried_writes_apply_once(client: shale.Client, wire: Wire, kind: str, call, check) -> None:  # type: ignore[no-untyped-def]
    client.put(b"once-d", b"v")
    rev0 = client.get(b"once-d").mod_revision  # type: ignore[union-attr]
    wire.calls.clear()
    wire.fault = lose_first_reply(kind)
    result = call(client)
    sent = wire.sent(kind)
    assert len(sent) >= 2 and len({s.header.request_id for s in sent}) == 1
    assert [s.header.first_attempt for s in sent] == [True] + [False] * (len(sent) - 1)
    assert check(result), f"the retry did not get the first application's result: {result}"
    wire.fault = None
    # Exactly one write applied: one revision of the shard, then the probe's.
    client.put(b"once-probe", b"x")  # the same shard as once-d
    probe = client.get(b"once-probe")
    assert probe is not None and probe.mod_revision == rev0 + 2


def test_outcome_unknown_then_settled_with_the_same_request_id(client: shale.Client, wire: Wire) -> None:
    # Every attempt reaches the node and applies, but no reply comes back:
    # the deadline ends the call and the outcome is unknown.
    def always_lost(request, send):  # type: ignore[no-untyped-def]
        if type(request).__name__ == "PutRequest":
            send()
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed (simulated)")
        return send()

    wire.fault = always_lost
    with pytest.raises(shale.OutcomeUnknown) as ei:
        client.put(b"unknown", b"v", timeout=1.0)
    e = ei.value
    assert isinstance(e.cause, shale.DeadlineExceeded) and isinstance(e.cause, TimeoutError)
    assert e.cause.last is not None and e.cause.last.code == grpc.StatusCode.UNAVAILABLE
    puts = wire.sent("PutRequest")
    assert len(puts) >= 2 and {p.header.request_id for p in puts} == {e.request_id}
    wire.fault = None
    kv = client.get(b"unknown")
    assert kv is not None and kv.version == 1, "attempts with one request ID applied more than once"
    # Settle it: the same write with the same request ID applies at most once.
    client.put(b"unknown", b"v", request_id=e.request_id)
    kv = client.get(b"unknown")
    assert kv is not None and kv.version == 1
    # An application's own request ID: sent twice, applied once, and never
    # marked first_attempt (it may have been sent before).
    # (Unique per run: the shard remembers IDs across deletes and runs.)
    app_id = b"order-" + os.urandom(6).hex().encode()
    wire.calls.clear()
    client.put(b"app-id", b"1", request_id=app_id)
    client.put(b"app-id", b"2", request_id=app_id)
    kv = client.get(b"app-id")
    assert kv is not None and (kv.value, kv.version) == (b"1", 1)
    assert [p.header.first_attempt for p in wire.sent("PutRequest")] == [False, False]


def test_outcome_unknown_keeps_a_later_refusal_as_cause(client: shale.Client, wire: Wire) -> None:
    state = {"n": 0}

    def fault(request, send):  # type: ignore[no-untyped-def]
        if type(request).__name__ != "PutRequest":
            return send()
        state["n"] += 1
        if state["n"] == 1:
            send()
            raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded (simulated attempt timeout)")
        raise FakeRpcError(grpc.StatusCode.PERMISSION_DENIED, "user alice may not write (simulated)")

    wire.fault = fault
    with pytest.raises(shale.OutcomeUnknown) as ei:
        client.put(b"later-refused", b"v")
    assert isinstance(ei.value.cause, shale.PermissionDenied)
    assert state["n"] == 2, "PermissionDenied must not be retried"


def test_write_that_never_left_is_not_outcome_unknown(endpoints, wire: Wire) -> None:  # type: ignore[no-untyped-def]
    def refused(request, send):  # type: ignore[no-untyped-def]
        if type(request).__name__ == "PutRequest":
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, NOT_SENT)
        return send()

    with shale.Client(endpoints, max_attempts=3) as c:
        wire.calls.clear()
        wire.fault = refused
        with pytest.raises(shale.Unavailable) as ei:
            c.put(b"never", b"v")
        assert not isinstance(ei.value, (shale.OutcomeUnknown, shale.DeadlineExceeded))
        assert ei.value.last is not None and ei.value.last.code == grpc.StatusCode.UNAVAILABLE
        assert len(wire.sent("PutRequest")) == 3, "max_attempts=3"
        # Each retry went to another replica after the first failed.
        assert len(set(wire.targets("PutRequest"))) >= 2
        wire.fault = None
        assert c.get(b"never") is None


def test_reads_retry_until_the_deadline_and_are_never_outcome_unknown(client: shale.Client, wire: Wire) -> None:
    def stalled(request, send):  # type: ignore[no-untyped-def]
        if type(request).__name__ == "GetRequest":
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "no quorum within the deadline (simulated)")
        return send()

    wire.calls.clear()
    wire.fault = stalled
    t0 = time.monotonic()
    with pytest.raises(shale.DeadlineExceeded) as ei:
        client.get(b"k", timeout=0.8)
    took = time.monotonic() - t0
    assert 0.7 < took < 3, took
    assert isinstance(ei.value, TimeoutError) and isinstance(ei.value, shale.Unavailable)
    assert len(wire.sent("GetRequest")) >= 3, "retried with backoff until the deadline"
    # Backoff with jitter: the attempts are spread, not a busy loop.
    assert len(wire.sent("GetRequest")) < 200


def test_overload_is_retried(client: shale.Client, wire: Wire) -> None:
    state = {"n": 0}

    def overloaded(request, send):  # type: ignore[no-untyped-def]
        if type(request).__name__ == "PutRequest":
            state["n"] += 1
            if state["n"] <= 2:
                raise FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many proposals in flight (simulated)")
        return send()

    wire.fault = overloaded
    client.put(b"busy", b"v")
    assert state["n"] == 3
    kv = client.get(b"busy")
    assert kv is not None and kv.version == 1


# -- routing: leader following and refreshes ---------------------------------


def test_follows_the_leader_hint(client: shale.Client, wire: Wire) -> None:
    # The placement service may move a leadership between the routing
    # refresh and the put (the follower picked may then lead): a few tries.
    for _ in range(5):
        client._refresh(shale.client._Deadline(10), -1)
        sh, _ = client._rt.locate(shale.client.Target(b"lead"))
        assert sh is not None and sh.leader
        leader = sh.leader
        follower = next(r.node_id for r in sh.desc.replicas if r.node_id != leader)
        sh.leader = follower  # the cache now names a follower,
        addr = client._rt.addr(leader)
        client._rt.nodes[leader] = "127.0.0.1:1"  # and a wrong address for the leader
        wire.calls.clear()
        client.put(b"lead", b"v", timeout=5)
        targets = wire.targets("PutRequest")
        if len(targets) == 2:
            break
    assert targets == [str(follower), str(leader)], "resent to the hinted leader at once"
    assert sh.leader == leader and client._rt.addr(leader) == addr, "the hint's leader and address were learnt"
    wire.calls.clear()
    client.put(b"lead", b"w")
    assert wire.targets("PutRequest") == [str(leader)], "the hint was remembered"


def test_routing_gap_is_refreshed(client: shale.Client, wire: Wire) -> None:
    with client._rt.mu:
        client._rt.shards = [s for s in client._rt.shards if not s.contains(b"gap")]
        client._rt._reindex()
    wire.calls.clear()
    client.put(b"gap", b"v")
    assert len(wire.sent("GetRoutingRequest")) == 1
    assert len(wire.sent("PutRequest")) == 1
