"""The logic the synchronous and the asyncio clients share (shale.client,
shale.aio): configuration, failure classification, request IDs, backoff,
the retry loop and every call's steps.

The steps are written once, as *plans*: generators that yield effects (an
RPC to send, a backoff to sleep, a routing refresh) and get their results
back (or have their exceptions thrown into them). The synchronous client
runs a plan's effects in the calling thread; the asyncio client awaits
them. Neither holds any logic of its own beyond that.
"""

from __future__ import annotations


import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Dict,
    Generator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

import grpc
from google.protobuf.message import Message

from shale._routing import Routing, Shard, Target, is_voter
from shale.errors import (
    ERROR_DOMAIN,
    REASON_WRONG_NODE,
    ClientClosed,
    CompareFailed,
    CrossShard,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    NotLeader,
    OutcomeUnknown,
    PermissionDenied,
    ShaleError,
    Unauthenticated,
    Unavailable,
    decode_details,
)
from shale.rpc import status_pb2
from shale.types import (
    TTL,
    Bytes,
    CasResult,
    Compare,
    Consistency,
    DeleteResult,
    KeyValue,
    Op,
    OpResult,
    PutResult,
    TxnResult,
    _kv_field,
    to_bytes,
    ttl_millis,
)
from shale.v1 import admin_pb2, admin_pb2_grpc, auth_pb2, auth_pb2_grpc, kv_pb2, kv_pb2_grpc, meta_pb2


log = logging.getLogger("shale")

#: The timeout of a call (all its retries included) when none is given.
DEFAULT_TIMEOUT = 10.0
#: The bound on each attempt (one RPC to one replica) of a call.
DEFAULT_ATTEMPT_TIMEOUT = 3.0
#: The retry backoff's bounds: the n-th consecutive retry waits a random time
#: in [0, min(max, initial * 2**(n-1))).
DEFAULT_BACKOFF_INITIAL = 0.02
DEFAULT_BACKOFF_MAX = 1.0
#: The length of the client's request IDs (96 random bits, as the Go SDK's).
REQUEST_ID_LEN = 12

# Leader hints followed in a row without a backoff.
_MAX_IMMEDIATE = 3
# How long the constructor keeps trying while every endpoint refuses connections.
_REFUSED_GIVE_UP = 2.0
# The least time one Authenticate attempt is given (bcrypt is slow on purpose).
_LOGIN_ATTEMPT_TIMEOUT = 5.0
# The part of a token's life after which the client gets the next one.
_TOKEN_REFRESH_FRACTION = 2.0 / 3
# Spacing of renewals that failed while the current token still served.
_TOKEN_RETRY_AFTER = 1.0

_TARGET_NODE_KEY = "shale-target-node-id"
_AUTHORIZATION_KEY = "authorization"

_RULED_OUT_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

R = TypeVar("R")


@dataclass(frozen=True)
class TLSConfig:
    """TLS settings for :class:`Client`. The files are PEM and read once, when
    the client is made.

    Attributes:
        ca_file: the CAs that sign the nodes' certificates; None for the
            system's roots.
        cert_file: the client certificate, for nodes that authenticate
            clients by certificate (``--client-cert-auth``); with key_file.
        key_file: the client certificate's private key.
        server_name: the name to verify the nodes' certificates against,
            when not the host of the address dialed.
    """

    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    server_name: Optional[str] = None


def _read(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


# --- Deadlines and failures ----------------------------------------------------


class _Deadline:
    """A call's deadline on the monotonic clock (None: no deadline)."""

    __slots__ = ("at",)

    def __init__(self, timeout: Optional[float]) -> None:
        self.at = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> Optional[float]:
        return None if self.at is None else self.at - time.monotonic()

    def expired(self) -> bool:
        # gRPC may fail an attempt for the deadline a moment before the
        # clock reaches it.
        return self.at is not None and self.at - time.monotonic() <= 0.001

    def bound(self, attempt: Optional[float]) -> Optional[float]:
        """The timeout of one attempt: the attempt timeout, within the deadline."""
        rem = self.remaining()
        if rem is None:
            return attempt
        rem = max(rem, 0.001)
        return rem if not attempt else min(attempt, rem)


class _Failure:
    """One failed RPC: its status, typed details, and whether it may have
    reached the node."""

    __slots__ = (
        "code",
        "message",
        "details",
        "sent",
        "not_leader",
        "epoch",
        "outside",
        "not_found",
        "cross_shard",
        "wrong_node",
    )

    def __init__(self, code: grpc.StatusCode, message: str, details: Sequence[Message] = (), sent: bool = True) -> None:
        self.code = code
        self.message = message
        self.details = tuple(details)
        self.not_leader: Optional[meta_pb2.NotLeader] = None
        self.epoch: Optional[meta_pb2.EpochMismatch] = None
        self.outside: Optional[meta_pb2.KeyOutsideShard] = None
        self.not_found: Optional[meta_pb2.ShardNotFound] = None
        self.cross_shard: Optional[meta_pb2.CrossShardRequest] = None
        self.wrong_node = False
        for d in self.details:
            if isinstance(d, meta_pb2.NotLeader):
                self.not_leader = d
            elif isinstance(d, meta_pb2.EpochMismatch):
                self.epoch = d
            elif isinstance(d, meta_pb2.KeyOutsideShard):
                self.outside = d
            elif isinstance(d, meta_pb2.ShardNotFound):
                self.not_found = d
            elif isinstance(d, meta_pb2.CrossShardRequest):
                self.cross_shard = d
            elif isinstance(d, status_pb2.ErrorInfo):
                if d.domain == ERROR_DOMAIN and d.reason == REASON_WRONG_NODE:
                    self.wrong_node = True
        # gRPC fails a call that found no connection (refused, or the
        # channel backing off) before sending anything, with this message.
        self.sent = sent and not (
            code == grpc.StatusCode.UNAVAILABLE and "failed to connect to all addresses" in message
        )

    @classmethod
    def of(cls, e: grpc.RpcError) -> "_Failure":
        code_fn = getattr(e, "code", None)
        details_fn = getattr(e, "details", None)
        code = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
        msg = details_fn() if callable(details_fn) else str(e)
        return cls(code or grpc.StatusCode.UNKNOWN, msg or "", decode_details(e))

    def too_large(self) -> bool:
        return self.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in self.message

    def overloaded(self) -> bool:
        return self.code == grpc.StatusCode.RESOURCE_EXHAUSTED and not self.too_large()

    def ctx_code(self) -> bool:
        return self.code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)

    def ruled_out(self) -> bool:
        """Whether the attempt provably did not apply its write."""
        if not self.sent or self.wrong_node:
            return True
        if self.not_leader or self.epoch or self.outside or self.not_found or self.cross_shard:
            return True
        return self.code in _RULED_OUT_CODES

    def typed(self, op: Optional[str] = None) -> ShaleError:
        """The public exception for this failure."""
        kw: Dict[str, Any] = {"code": self.code, "details": self.details, "op": op}
        if self.cross_shard is not None:
            return CrossShard(
                self.message, split_key=self.cross_shard.split_key, shard_id=self.cross_shard.shard_id, **kw
            )
        if self.not_leader is not None:
            nl = self.not_leader
            return NotLeader(
                self.message,
                shard_id=nl.shard_id,
                leader_node_id=nl.leader_node_id,
                leader_address=nl.leader_address,
                **kw,
            )
        if self.code == grpc.StatusCode.INVALID_ARGUMENT:
            return InvalidArgument(self.message, **kw)
        if self.too_large():
            return InvalidArgument(
                "the request is larger than a node accepts (see the value and batch limits in docs/api.md): "
                + self.message,
                **kw,
            )
        if self.code == grpc.StatusCode.UNAUTHENTICATED:
            return Unauthenticated(self.message, **kw)
        if self.code == grpc.StatusCode.PERMISSION_DENIED:
            return PermissionDenied(self.message, **kw)
        if self.code == grpc.StatusCode.NOT_FOUND and self.not_found is None:
            return NotFound(self.message, **kw)
        return ShaleError(self.message, **kw)


class _NoNodeAnswered(Exception):
    """No address answered a call made to any node (GetRouting, Authenticate)."""

    def __init__(self, failures: List[Tuple[str, _Failure]]) -> None:
        super().__init__("; ".join(f"{a}: {f.code.name}: {f.message}" for a, f in failures) or "no address to ask")
        self.failures = failures

    def all(self, pred: Callable[[_Failure], bool]) -> bool:
        return bool(self.failures) and all(pred(f) for _, f in self.failures)

    def last(self, op: str) -> ShaleError:
        if not self.failures:
            return ShaleError("no address to ask", op=op)
        return self.failures[-1][1].typed(op)


def _security_refusal(f: _Failure) -> bool:
    """A refusal that retrying cannot cure: a failed TLS handshake, or the
    credentials refused."""
    if f.code == grpc.StatusCode.UNAUTHENTICATED:
        return True
    if f.code == grpc.StatusCode.UNAVAILABLE:
        m = f.message.lower()
        return "ssl" in m or "certificate" in m or "x509" in m
    return False


def _connection_refused(f: _Failure) -> bool:
    return f.code == grpc.StatusCode.UNAVAILABLE and "connection refused" in f.message.lower()


class _Regroup(Exception):
    """multi_get's keys of one group are no longer in one shard."""


class _Spec:
    """One logical request for _invoke."""

    __slots__ = ("op", "leader_only", "write", "request_id", "app_request_id", "consistency")

    def __init__(
        self,
        op: str,
        *,
        leader_only: bool = True,
        write: bool = False,
        request_id: Optional[bytes] = None,
        consistency: str = Consistency.LINEARIZABLE,
    ) -> None:
        self.op = op
        self.leader_only = leader_only
        self.write = write
        self.app_request_id = request_id is not None
        if write and request_id is None:
            request_id = os.urandom(REQUEST_ID_LEN)
        self.request_id = request_id or b""
        self.consistency = Consistency.to_proto(consistency)

    @staticmethod
    def read(op: str, consistency: str) -> "_Spec":
        return _Spec(op, leader_only=consistency == Consistency.LINEARIZABLE, consistency=consistency)

    @staticmethod
    def for_write(op: str, request_id: Optional[bytes]) -> "_Spec":
        if request_id is not None:
            request_id = to_bytes(request_id, "request_id")
            if not 8 <= len(request_id) <= 32:
                raise InvalidArgument(f"request_id is {len(request_id)} bytes; want 8 to 32", op=op)
        return _Spec(op, write=True, request_id=request_id)




class _Stubs:
    """A node's channel (a grpc.Channel or a grpc.aio.Channel) and its
    service stubs."""

    __slots__ = ("channel", "kv", "admin", "auth")

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        # (The generated stubs have no type annotations.)
        self.kv = kv_pb2_grpc.KVStub(channel)  # type: ignore[no-untyped-call]
        self.admin = admin_pb2_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
        self.auth = auth_pb2_grpc.AuthStub(channel)  # type: ignore[no-untyped-call]


# --- Plans and their effects ----------------------------------------------------

#: A plan: a generator of effects whose return value is the call's result.
Plan = Generator[Any, Any, R]


class _Sleep:
    """Effect: wait d seconds, or until the deadline or the client's close;
    the result is True if the full wait passed."""

    __slots__ = ("d", "deadline")

    def __init__(self, d: float, deadline: _Deadline) -> None:
        self.d = d
        self.deadline = deadline


class _Refresh:
    """Effect: reload the routing table, one refresh shared by concurrent
    callers (see the clients' _refresh); raises _NoNodeAnswered."""

    __slots__ = ("deadline", "seen")

    def __init__(self, deadline: _Deadline, seen: int) -> None:
        self.deadline = deadline
        self.seen = seen


class _Send:
    """Effect: one unary RPC; the result is the response, or the gRPC error
    (or _ClosedChannel, ClientClosed) is thrown into the plan."""

    __slots__ = ("method", "request", "timeout", "md")

    def __init__(self, method: Any, request: Message, timeout: Optional[float], md: List[Tuple[str, str]]) -> None:
        self.method = method
        self.request = request
        self.timeout = timeout
        self.md = md


class _Retries:
    """The consecutive retries of one call: backoffs (each longer) and
    resends without one (immediate; reset by every backoff)."""

    __slots__ = ("client", "deadline", "nback", "immediate")

    def __init__(self, client: "_Base", deadline: _Deadline) -> None:
        self.client = client
        self.deadline = deadline
        self.nback = 0
        self.immediate = 0

    def backoff(self) -> _Sleep:
        """The next backoff's effect."""
        self.immediate = 0
        self.nback += 1
        return _Sleep(self.client._backoff(self.nback), self.deadline)


class _Stepper:
    """Walks a plan: next() is its next effect (None once it returned, with
    the return value in result), fed the effect's value or exception."""

    __slots__ = ("plan", "val", "exc", "result")

    def __init__(self, plan: Plan[Any]) -> None:
        self.plan = plan
        self.val: Any = None
        self.exc: Optional[Exception] = None
        self.result: Any = None

    def next(self) -> Any:
        val, exc = self.val, self.exc
        self.val, self.exc = None, None
        try:
            return self.plan.throw(exc) if exc is not None else self.plan.send(val)
        except StopIteration as s:
            self.result = s.value
            return None

    def run(self, do: Callable[[Any], Any], eff: Any) -> None:
        """Run an effect synchronously and keep its outcome for next()."""
        try:
            self.val = do(eff)
        except Exception as e:
            self.exc = e


class _Item:
    """Effect of a scan's plan: one key to hand to the caller."""

    __slots__ = ("value",)

    def __init__(self, value: KeyValue) -> None:
        self.value = value


class _Attempt:
    """One attempt of a KV request: the replica's channel, the shard and the
    header it is addressed with, and call() to send it."""

    __slots__ = ("client", "stubs", "shard", "header", "timeout", "metadata")

    def __init__(
        self,
        client: "_Base",
        stubs: _Stubs,
        shard: Shard,
        header: kv_pb2.RequestHeader,
        timeout: Optional[float],
        metadata: List[Tuple[str, str]],
    ) -> None:
        self.client = client
        self.stubs = stubs
        self.shard = shard
        self.header = header
        self.timeout = timeout
        self.metadata = metadata

    def call(self, method: str, request: Message) -> Plan[Any]:
        """Send the request with KV's unary method ``method``."""
        return self.client._rpc_plan(getattr(self.stubs.kv, method), request, self.timeout, self.metadata)


class _TokenAuth:
    """The client's credentials and its current token (client/auth.go)."""

    def __init__(self, client: "_Base", user: str, password: str) -> None:
        self.client = client
        self.user = user
        self.password = password
        self.mu = threading.Lock()  # never held across an effect
        self.ready = False
        self.token = ""  # empty while the cluster's auth is disabled
        self.refresh_at = 0.0  # monotonic; 0: never
        self.expire_at = 0.0  # monotonic; 0: until a node refuses it
        self.issued = 0  # bumped by every login

    def login(self, deadline: _Deadline) -> Plan[None]:
        """Authenticate and install the token, or record that the cluster's
        authentication is disabled. Raises Unauthenticated when the
        credentials are refused."""
        now = time.monotonic()
        wall = time.time()
        try:
            resp = yield from self.client._authenticate_plan(self.user, self.password, deadline)
        except _AuthDisabled:
            with self.mu:
                self.ready, self.token, self.refresh_at, self.expire_at = True, "", 0.0, 0.0
                self.issued += 1
            log.debug("shale client: authentication is not enabled; sending no token")
            return
        with self.mu:
            self.ready, self.token, self.refresh_at, self.expire_at = True, resp.token, 0.0, 0.0
            self.issued += 1
            if resp.expires_unix_ms > 0:
                life = resp.expires_unix_ms / 1000.0 - wall
                if life > 0:
                    self.refresh_at = now + life * _TOKEN_REFRESH_FRACTION
                    self.expire_at = now + life - min(life / 10, 10.0)

    def get(self, deadline: _Deadline) -> Plan[Tuple[str, int]]:
        """The token to send (and its login number): the current one while it
        is valid, renewing it once its refresh time has passed."""
        with self.mu:
            now = time.monotonic()
            valid = self.ready and (not self.expire_at or now < self.expire_at)
            due = valid and self.token and self.refresh_at and now >= self.refresh_at
            if valid and not due:
                return self.token, self.issued
            tok, issued = self.token, self.issued
        try:
            yield from self.login(deadline)
        except ShaleError:
            if not valid:
                raise
            # The current token still serves: try again a little later.
            with self.mu:
                self.refresh_at = time.monotonic() + _TOKEN_RETRY_AFTER
            return tok, issued
        with self.mu:
            return self.token, self.issued

    def renew(self, used_issued: int, deadline: _Deadline) -> Plan[Tuple[str, int, bool]]:
        """Replace a token a node refused; returns the new token, its login
        number, and whether this call's login issued it."""
        with self.mu:
            if self.ready and self.issued != used_issued and (not self.expire_at or time.monotonic() < self.expire_at):
                return self.token, self.issued, False
            self.ready = False
        yield from self.login(deadline)
        with self.mu:
            return self.token, self.issued, True

class _AuthDisabled(Exception):
    """Authenticate answered that the cluster's authentication is not enabled."""


def _rejected(f: _Failure, tok: str) -> bool:
    """Whether a node refused the token tok in a way a new token may cure."""
    if f.code != grpc.StatusCode.UNAUTHENTICATED:
        return False
    if not tok:
        return True
    m = f.message.lower()
    return "token" in m or "expired" in m or "revoked" in m


def _prefix_end(p: bytes) -> bytes:
    """The first key after every key with prefix p; b"" (the end of the key
    space) when there is none."""
    b = bytearray(p)
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1])
    return b""


def _check_endpoint(e: str) -> None:
    if "://" in e or e.startswith("unix:"):
        return
    host, sep, port = e.rpartition(":")
    if not sep or not port or (host.count(":") and not host.startswith("[")):
        raise InvalidArgument(
            f"endpoint {e!r} has no port: give host:port (a node's client port, shale-server --listen: "
            f"{e.rstrip(':')}:7001 by default)"
        )
    if not port.isdigit() or not 0 < int(port) <= 65535:
        raise InvalidArgument(f"endpoint {e!r}: port {port!r} is not a number from 1 to 65535")



class _ClosedChannel(Exception):
    """A call made on a channel closed under it."""


def _check_one_shard(d: meta_pb2.ShardDescriptor, spans: List[Tuple[bytes, Optional[bytes]]], op: str) -> None:
    """Raise CrossShard unless every key and range lies in the shard d."""
    for start, end in spans:
        if start < d.start_key:
            raise _cross_shard(d.start_key, d.shard_id, op)
        if not d.end_key:
            continue
        if start >= d.end_key or (end is not None and (not end or end > d.end_key)):
            raise _cross_shard(d.end_key, d.shard_id, op)


def _cross_shard(split_key: bytes, shard_id: int, op: str) -> CrossShard:
    return CrossShard(
        f"request crosses shard boundary {split_key!r} of shard {shard_id} "
        "(transactions must stay within one shard)",
        split_key=split_key,
        shard_id=shard_id,
        code=grpc.StatusCode.INVALID_ARGUMENT,
        details=(meta_pb2.CrossShardRequest(split_key=split_key, shard_id=shard_id),),
        op=op,
    )


def _pick_replica(sh: Shard, leader_only: bool, avoid: Set[int], rr: List[int]) -> int:
    """The node for the next attempt: the cached leader unless it failed in
    this call, else the next replica (a voter when the leader is needed)
    that has not failed, rotating. When every candidate failed, the slate is
    wiped and they are tried again."""
    lead = sh.leader
    if lead and lead not in avoid:
        return lead
    cands: List[int] = []
    for _ in range(2):
        cands = [r.node_id for r in sh.desc.replicas if (not leader_only or is_voter(r)) and r.node_id not in avoid]
        if cands:
            break
        avoid.clear()
    if not cands:
        return 0
    rr[0] += 1
    return cands[rr[0] % len(cands)]



def _check_ops(ops: Sequence[Op]) -> Sequence[Op]:
    for o in ops:
        if not isinstance(o, Op):
            raise InvalidArgument(
                f"not an operation: {o!r} (use shale.Put, shale.Delete, shale.DeleteRange or shale.Get)", op="txn"
            )
    return ops


def backoff_delay(n: int, initial: float, maximum: float) -> float:
    """The wait before the n-th consecutive retry: exponential with full
    jitter, a random time in [0, min(maximum, initial * 2**(n-1)))."""
    d = initial * (2 ** min(max(n - 1, 0), 30))
    d = min(d, maximum)
    return random.uniform(0, d) if d > 0 else 0.0


def _credentials(tls: Union[None, bool, TLSConfig, grpc.ChannelCredentials]) -> Optional[grpc.ChannelCredentials]:
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, TLSConfig):
        if bool(tls.cert_file) != bool(tls.key_file):
            raise InvalidArgument("TLSConfig: give both cert_file and key_file, or neither", op="connect")
        try:
            return grpc.ssl_channel_credentials(
                root_certificates=_read(tls.ca_file),
                private_key=_read(tls.key_file),
                certificate_chain=_read(tls.cert_file),
            )
        except OSError as e:
            raise InvalidArgument(f"TLS files: {e}", op="connect") from e
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    raise TypeError(f"shale: tls must be a TLSConfig, True or grpc.ChannelCredentials, not {type(tls).__name__}")


def _scan_range(
    start: Optional[Bytes], end: Optional[Bytes], prefix: Optional[Bytes], op: str
) -> Tuple[bytes, bytes]:
    """The [lo, hi) of a scan's or a watch's arguments (hi b"": the end of the
    key space); InvalidArgument for an inverted range or prefix with bounds."""
    if prefix is not None:
        if start is not None or end is not None:
            raise InvalidArgument("prefix needs start and end to be None", op=op)
        lo = to_bytes(prefix)
        return lo, _prefix_end(lo)
    lo, hi = to_bytes(start), to_bytes(end)
    if hi and lo >= hi:
        raise InvalidArgument(f"empty range [{lo!r}, {hi!r}): start must be before end", op=op)
    return lo, hi


class _Base:
    """What both clients are: their configuration, connections, routing cache
    and credentials, and the plans of every call. A subclass runs the plans
    (see _run) and makes the channels (_new_channel)."""

    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        *,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        attempt_timeout: Optional[float] = DEFAULT_ATTEMPT_TIMEOUT,
        backoff_initial: float = DEFAULT_BACKOFF_INITIAL,
        backoff_max: float = DEFAULT_BACKOFF_MAX,
        max_attempts: int = 0,
        tls: Union[None, bool, TLSConfig, grpc.ChannelCredentials] = None,
        user: Optional[str] = None,
        password: Optional[str] = None,
        channel_options: Sequence[Tuple[str, Any]] = (),
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = endpoints.split(",")
        eps: List[str] = []
        for e in endpoints:
            e = e.strip()
            if e:
                _check_endpoint(e)
                eps.append(e)
        if not eps:
            raise InvalidArgument("no endpoints", op="connect")
        self._endpoints = eps
        self._timeout = timeout
        self._attempt_timeout = attempt_timeout or None
        self._backoff_initial = max(backoff_initial, 0.0)
        self._backoff_max = max(backoff_max, self._backoff_initial)
        self._max_attempts = max_attempts
        self._creds = _credentials(tls)
        self._tls_name = tls.server_name if isinstance(tls, TLSConfig) else None
        self._options: List[Tuple[str, Any]] = [
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 5_000),
            # Each channel its own connection, so that a channel dropped
            # for reaching the wrong node is dialed again for real.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if self._tls_name:
            self._options.append(("grpc.ssl_target_name_override", self._tls_name))
        self._options.extend(channel_options)
        self._mu = threading.Lock()
        self._stubs: Dict[str, _Stubs] = {}
        self._retired: List[Any] = []
        self._closed = threading.Event()
        self._rt = Routing()
        self._auth: Optional[_TokenAuth] = None
        if user is not None:
            if not user:
                raise InvalidArgument("empty user name", op="connect")
            self._auth = _TokenAuth(self, user, password or "")
        self._start()

    def _start(self) -> None:
        """The subclass's part of the constructor."""

    # -- lifetime and connections --

    def _new_channel(self, addr: str) -> Any:
        raise NotImplementedError

    def _take_channels(self) -> List[Any]:
        """Mark the client closed and hand over every channel to close (none
        when it was closed already)."""
        with self._mu:
            if self._closed.is_set():
                return []
            self._closed.set()
            chans = [s.channel for s in self._stubs.values()] + self._retired
            self._stubs, self._retired = {}, []
        return chans

    @property
    def endpoints(self) -> List[str]:
        """The endpoints the client was made with."""
        return list(self._endpoints)

    def routing(self) -> Tuple[List[Tuple[meta_pb2.ShardDescriptor, int]], Dict[int, str]]:
        """A copy of the client's routing table, for inspection: the shards
        sorted by start key as (descriptor, last known leader node ID), and
        the node addresses by node ID."""
        return self._rt.snapshot()

    def _conn(self, addr: str) -> _Stubs:
        with self._mu:
            if self._closed.is_set():
                raise ClientClosed("client closed")
            s = self._stubs.get(addr)
            if s is None:
                s = _Stubs(self._new_channel(addr))
                self._stubs[addr] = s
            return s

    def _retire(self, addr: str, stubs: _Stubs) -> None:
        """Stop using a channel that reached the wrong node; it is closed
        with the client (calls on it may still be in flight)."""
        with self._mu:
            if self._stubs.get(addr) is stubs:
                del self._stubs[addr]
                self._retired.append(stubs.channel)
        log.info("shale client: the address %s reached another node; dialing it again", addr)

    def _backoff(self, n: int) -> float:
        return backoff_delay(n, self._backoff_initial, self._backoff_max)

    def _stopped(self, deadline: _Deadline, op: str, last: Optional[ShaleError]) -> ShaleError:
        """The error of a call whose retries ended."""
        if self._closed.is_set():
            return ClientClosed("client closed", op=op)
        tail = f"; last error: {last}" if last is not None else ""
        if deadline.expired():
            return DeadlineExceeded("unavailable: deadline exceeded" + tail, op=op, last=last)
        return Unavailable("unavailable: retries exhausted" + tail, op=op, last=last)

    def _rpc_plan(self, method: Any, request: Message, timeout: Optional[float], md: List[Tuple[str, str]]) -> Plan[Any]:
        """Send one unary call with the token (renewing it and resending once
        when a node refuses it)."""
        a = self._auth
        if a is None:
            return (yield _Send(method, request, timeout, md))
        deadline = _Deadline(timeout)
        tok, issued = yield from a.get(deadline)
        try:
            return (yield _Send(method, request, timeout, _with_token(md, tok)))
        except grpc.RpcError as e:
            f = _Failure.of(e)
            if not _rejected(f, tok):
                raise
            log.debug("shale client: token refused; authenticating again: %s", f.message)
            err: grpc.RpcError = e
        for _ in range(2):
            tok, issued, fresh = yield from a.renew(issued, deadline)
            try:
                return (yield _Send(method, request, deadline.bound(None), _with_token(md, tok)))
            except grpc.RpcError as e2:
                err = e2
                if fresh or not _rejected(_Failure.of(e2), tok):
                    raise
        raise err

    def _token_plan(self, deadline: _Deadline) -> Plan[Tuple[str, int]]:
        """The token to send on a stream (empty without credentials)."""
        if self._auth is None:
            return "", 0
        return (yield from self._auth.get(deadline))

    # -- routing --

    def _admin_addrs(self) -> List[str]:
        """The addresses for cluster-level requests: the last that answered,
        then the endpoints, then every known node."""
        with self._rt.mu:
            addrs = ([self._rt.last_good] if self._rt.last_good else []) + self._endpoints
            addrs += [self._rt.nodes[i] for i in sorted(self._rt.nodes)]
        seen: Set[str] = set()
        out = []
        for a in addrs:
            if a not in seen:
                seen.add(a)
                out.append(a)
        return out

    def _fetch_routing_plan(self, deadline: _Deadline) -> Plan[None]:
        failures: List[Tuple[str, _Failure]] = []
        for addr in self._admin_addrs():
            stubs = self._conn(addr)
            t = deadline.bound(self._attempt_timeout or DEFAULT_TIMEOUT)
            try:
                resp = yield from self._rpc_plan(stubs.admin.GetRouting, admin_pb2.GetRoutingRequest(), t, [])
            except grpc.RpcError as e:
                f = _Failure.of(e)
                log.debug("shale client: GetRouting via %s failed: %s %s", addr, f.code, f.message)
                failures.append((addr, f))
                if self._closed.is_set():
                    raise ClientClosed("client closed") from None
                continue
            except _ClosedChannel as e:
                failures.append((addr, _Failure(grpc.StatusCode.UNAVAILABLE, str(e), sent=False)))
                continue
            self._rt.replace(resp, addr)
            log.debug("shale client: routing refreshed via %s: %d shards", addr, len(resp.shards))
            return
        raise _NoNodeAnswered(failures)

    def _connect_plan(self) -> Plan[None]:
        deadline = _Deadline(self._timeout)
        if self._auth is not None:
            yield from self._auth.login(deadline)
        attempt = 0
        refused_since = 0.0
        last: Optional[ShaleError] = None
        while True:
            attempt += 1
            try:
                yield _Refresh(deadline, -1)
                return
            except _NoNodeAnswered as e:
                last = e.last("connect")
                if e.all(_security_refusal):
                    if isinstance(last, Unauthenticated):
                        raise Unauthenticated(
                            f"refused by every endpoint's security (TLS or credentials): {e}", op="connect"
                        ) from None
                    raise Unavailable(
                        f"refused by every endpoint's security (TLS or credentials): {e}", op="connect", last=last
                    ) from None
                if not e.all(_connection_refused):
                    refused_since = 0.0
                elif not refused_since:
                    refused_since = time.monotonic()
                elif time.monotonic() - refused_since >= _REFUSED_GIVE_UP:
                    raise Unavailable(
                        f"unavailable: no node reachable at {', '.join(self._endpoints)}: connection refused "
                        f"(for {_REFUSED_GIVE_UP:g}s; is the cluster running, and are these its client addresses?)",
                        op="connect",
                        last=last,
                    ) from None
            if self._max_attempts and attempt >= self._max_attempts:
                raise self._stopped(_Deadline(None), "connect", last)
            if deadline.expired() or not (yield _Sleep(self._backoff(attempt), deadline)):
                raise self._stopped(deadline, "connect", last)

    def _authenticate_plan(self, user: str, password: str, deadline: _Deadline) -> Plan[auth_pb2.AuthenticateResponse]:
        """Ask the nodes in turn for a token, passing over them with backoff
        until one answers or refuses the credentials."""
        req = auth_pb2.AuthenticateRequest(name=user, password=password)
        attempt = 0
        last: Optional[ShaleError] = None
        while True:
            attempt += 1
            failures: List[Tuple[str, _Failure]] = []
            for addr in self._admin_addrs():
                stubs = self._conn(addr)
                t = deadline.bound(max(self._attempt_timeout or 0, _LOGIN_ATTEMPT_TIMEOUT))
                try:
                    resp = yield _Send(stubs.auth.Authenticate, req, t, [])
                    with self._rt.mu:
                        self._rt.last_good = addr
                    return resp  # type: ignore[no-any-return]
                except _ClosedChannel as e:
                    failures.append((addr, _Failure(grpc.StatusCode.UNAVAILABLE, str(e), sent=False)))
                    continue
                except grpc.RpcError as e:
                    f = _Failure.of(e)
                if self._closed.is_set():
                    raise ClientClosed("client closed", op="authenticate")
                if f.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED) and not f.not_leader:
                    raise _AuthDisabled()
                if f.code == grpc.StatusCode.UNAUTHENTICATED:
                    raise f.typed("authenticate")
                retryable = (
                    f.not_leader is not None
                    or f.overloaded()
                    or f.code in (grpc.StatusCode.ABORTED, grpc.StatusCode.UNAVAILABLE)
                    or f.ctx_code()
                )
                if not retryable:
                    raise f.typed("authenticate")
                failures.append((addr, f))
                if deadline.expired():
                    break
            nna = _NoNodeAnswered(failures)
            if failures:
                last = nna.last("authenticate")
            if nna.all(_security_refusal):
                raise Unavailable(
                    f"refused by every endpoint's security (TLS or credentials): {nna}", op="authenticate", last=last
                )
            if self._max_attempts and attempt >= self._max_attempts:
                raise self._stopped(_Deadline(None), "authenticate", last)
            if deadline.expired() or not (yield _Sleep(self._backoff(attempt), deadline)):
                raise self._stopped(deadline, "authenticate", last)
    def _learn_shards(self, em: Optional[meta_pb2.EpochMismatch]) -> bool:
        """Install the shards an EpochMismatch describes; True if anything was new."""
        if em is None:
            return False
        learnt = self._rt.apply(em.current) if em.HasField("current") else False
        if em.HasField("next") and self._rt.apply(em.next.descriptor):
            learnt = True
            lead = em.next.leader_node_id
            if lead and self._rt.addr(lead):
                self._rt.set_leader(em.next.descriptor.shard_id, lead)
        return learnt

    # -- the retry loop --


    def _deadline(self, timeout: Optional[float]) -> _Deadline:
        return _Deadline(self._timeout if timeout is None else timeout)

    def _invoke_plan(self, spec: _Spec, tg: Target, fn: Callable[[_Attempt], Plan[R]], deadline: _Deadline) -> Plan[R]:
        """Run one logical request against the shard of tg with retries.
        The error of a write some attempt of which may have applied is
        OutcomeUnknown."""
        maybe_applied = [False]
        try:
            return (yield from self._attempts_plan(spec, tg, fn, deadline, maybe_applied))
        except ShaleError as e:
            if maybe_applied[0] and not isinstance(e, OutcomeUnknown):
                raise OutcomeUnknown(
                    f"outcome unknown, the write may have applied: {e}",
                    cause=e,
                    request_id=spec.request_id,
                    op=spec.op,
                    code=e.code,
                    details=e.details,
                ) from e
            raise

    def _attempts_plan(
        self, spec: _Spec, tg: Target, fn: Callable[[_Attempt], Plan[R]], deadline: _Deadline, maybe_applied: List[bool]
    ) -> Plan[R]:
        last: Optional[ShaleError] = None
        nroute = 0  # consecutive routing errors
        override = 0
        avoid: Set[int] = set()
        rr = [random.getrandbits(32)]  # replica rotation, spreads load
        attempt = 0

        rs = _Retries(self, deadline)

        while True:
            attempt += 1
            if self._closed.is_set():
                raise ClientClosed("client closed", op=spec.op)
            if deadline.expired():
                raise self._stopped(deadline, spec.op, last)
            if self._max_attempts and attempt > self._max_attempts:
                raise self._stopped(_Deadline(None), spec.op, last)
            sh, gen = self._rt.locate(tg)
            if sh is None:
                # No cached shard holds the key (a gap left by a split):
                # refresh, and back off if that does not help.
                try:
                    yield _Refresh(deadline, gen)
                except _NoNodeAnswered as e:
                    last = e.last(spec.op)
                    if not (yield rs.backoff()):
                        raise self._stopped(deadline, spec.op, last) from None
                    continue
                sh, _ = self._rt.locate(tg)
                if sh is None:
                    last = Unavailable(f"no shard covers key {tg.key!r}", op=spec.op)
                    if not (yield rs.backoff()):
                        raise self._stopped(deadline, spec.op, last)
                    continue
            node = override
            override = 0
            if not node:
                node = _pick_replica(sh, spec.leader_only, avoid, rr)
            addr = self._rt.addr(node)
            if not node or not addr:
                last = Unavailable(f"no address known for a replica of shard {sh.id}", op=spec.op)
                try:
                    yield _Refresh(deadline, gen)
                except _NoNodeAnswered as e:
                    last = e.last(spec.op)
                if not (yield rs.backoff()):
                    raise self._stopped(deadline, spec.op, last)
                continue
            stubs = self._conn(addr)
            hdr = kv_pb2.RequestHeader(
                shard_id=sh.id,
                epoch=sh.epoch,
                request_id=spec.request_id,
                consistency=spec.consistency,  # type: ignore[arg-type]
                # Only the first attempt can promise that the ID is new; an
                # application's own ID may have been sent by an earlier call.
                first_attempt=attempt == 1 and bool(spec.request_id) and not spec.app_request_id,
            )
            at = _Attempt(self, stubs, sh, hdr, deadline.bound(self._attempt_timeout), [(_TARGET_NODE_KEY, str(node))])
            try:
                result = yield from fn(at)
            except grpc.RpcError as e:
                f = _Failure.of(e)
            except _ClosedChannel as e:
                f = _Failure(grpc.StatusCode.UNAVAILABLE, f"channel closed: {e}", sent=False)
            else:
                if spec.leader_only and sh.leader != node:
                    self._rt.set_leader(sh.id, node)
                return result
            if spec.write and not f.ruled_out():
                maybe_applied[0] = True
            if self._closed.is_set():
                raise ClientClosed("client closed", op=spec.op)
            if deadline.expired():
                # The call's own deadline cut this attempt short: the error
                # before it says more about why.
                if last is None or not f.ctx_code():
                    last = f.typed(spec.op)
                raise self._stopped(deadline, spec.op, last)
            last = f.typed(spec.op)
            log.debug(
                "shale client: %s attempt %d on shard %d node %d failed: %s %s",
                spec.op, attempt, sh.id, node, f.code.name, f.message,
            )
            if f.cross_shard is not None:
                raise last
            if f.wrong_node and rs.immediate < _MAX_IMMEDIATE:
                # The address reached another node: dial it again.
                self._retire(addr, stubs)
                rs.immediate += 1
                override = node
                continue
            if f.not_leader is not None:
                nroute = 0
                hint = f.not_leader.leader_node_id
                if hint and hint != node:
                    self._rt.set_addr(hint, f.not_leader.leader_address)
                    self._rt.set_leader(sh.id, hint)
                    override = hint
                    if rs.immediate < _MAX_IMMEDIATE:
                        rs.immediate += 1
                        continue
                else:
                    avoid.add(node)
                    Routing.clear_leader(sh, node)
                if not (yield rs.backoff()):
                    raise self._stopped(deadline, spec.op, last)
                continue
            if f.epoch is not None or f.outside is not None or f.not_found is not None:
                nroute += 1
                if f.not_found is not None:
                    avoid.add(node)
                cur = f.epoch.current if f.epoch is not None and f.epoch.HasField("current") else None
                if cur is not None and cur.shard_id == sh.id and cur.epoch < sh.epoch:
                    # The replica lags behind our routing: ask another.
                    avoid.add(node)
                    if not (yield rs.backoff()):
                        raise self._stopped(deadline, spec.op, last)
                    continue
                if self._learn_shards(f.epoch) and nroute == 1:
                    if self._rt.locate(tg)[0] is not None:
                        continue
                try:
                    yield _Refresh(deadline, gen)
                except _NoNodeAnswered as e:
                    last = e.last(spec.op)
                if nroute > 1 and not (yield rs.backoff()):
                    raise self._stopped(deadline, spec.op, last)
                continue
            if f.overloaded():
                if not (yield rs.backoff()):
                    raise self._stopped(deadline, spec.op, last)
                continue
            if f.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                # Unreachable, stalled or without quorum: the next replica.
                avoid.add(node)
                Routing.clear_leader(sh, node)
                if not (yield rs.backoff()):
                    raise self._stopped(deadline, spec.op, last)
                continue
            raise last

    def _invoke_any_node_plan(
        self, op: str, mutation: bool, fn: Callable[[_Stubs, Optional[float]], Plan[R]], timeout: Optional[float]
    ) -> Plan[R]:
        """Run an Admin or Auth request on any node (the last that answered
        first), following NotLeader hints and moving on from unavailable
        nodes; read-only requests also after an attempt timeout."""
        deadline = self._deadline(timeout)
        addrs = self._admin_addrs()
        last: Optional[ShaleError] = None
        nxt = 0
        override = ""
        attempt = 0

        rs = _Retries(self, deadline)

        while True:
            attempt += 1
            if self._closed.is_set():
                raise ClientClosed("client closed", op=op)
            if deadline.expired():
                raise self._stopped(deadline, op, last)
            if self._max_attempts and attempt > self._max_attempts:
                raise self._stopped(_Deadline(None), op, last)
            addr = override or addrs[nxt % len(addrs)]
            override = ""
            stubs = self._conn(addr)
            try:
                result = yield from fn(stubs, deadline.bound(self._attempt_timeout))
            except grpc.RpcError as e:
                f = _Failure.of(e)
            except _ClosedChannel as e:
                f = _Failure(grpc.StatusCode.UNAVAILABLE, str(e), sent=False)
            else:
                with self._rt.mu:
                    self._rt.last_good = addr
                return result
            if self._closed.is_set():
                raise ClientClosed("client closed", op=op)
            if deadline.expired():
                if last is None or not f.ctx_code():
                    last = f.typed(op)
                raise self._stopped(deadline, op, last)
            last = f.typed(op)
            if f.not_leader is not None:
                hint = f.not_leader.leader_address or self._rt.addr(f.not_leader.leader_node_id)
                if hint and hint != addr and rs.immediate < _MAX_IMMEDIATE:
                    rs.immediate += 1
                    override = hint
                    continue
                override = hint
                if not hint:
                    nxt += 1
                if not (yield rs.backoff()):
                    raise self._stopped(deadline, op, last)
            elif f.overloaded():
                if not (yield rs.backoff()):
                    raise self._stopped(deadline, op, last)
            elif f.code == grpc.StatusCode.UNAVAILABLE or (not mutation and f.ctx_code()):
                nxt += 1
                if not (yield rs.backoff()):
                    raise self._stopped(deadline, op, last)
            else:
                raise last

    # -- KV API --


    # -- the calls' plans (the public methods, with their documentation, are
    # the clients') --

    def _get_plan(self, key: Bytes, consistency: str, must_exist: bool, timeout: Optional[float]) -> Plan[Optional[KeyValue]]:
        k = to_bytes(key)

        def attempt(a: _Attempt) -> Plan[Any]:
            return (yield from a.call("Get", kv_pb2.GetRequest(header=a.header, key=k)))

        resp = yield from self._invoke_plan(_Spec.read("get", consistency), Target(k), attempt, self._deadline(timeout))
        kv = _kv_field(resp, "kv")
        if kv is None and must_exist:
            raise NotFound(f"key {k!r} not found", key=k, op="get")
        return kv

    def _multi_get_plan(self, keys: Sequence[Bytes], consistency: str, timeout: Optional[float]) -> Plan[List[Optional[KeyValue]]]:
        ks = [to_bytes(k) for k in keys]
        out: List[Optional[KeyValue]] = [None] * len(ks)
        if not ks:
            return out
        deadline = self._deadline(timeout)
        pending = list(range(len(ks)))
        rnd = 0
        while pending:
            rnd += 1
            if rnd > 2 and not (yield _Sleep(self._backoff(rnd - 2), deadline)):
                raise self._stopped(deadline, "multiget", ShaleError("keys no longer in one shard", op="multiget"))
            again: List[int] = []
            for g in self._group_by_shard(ks, pending):
                try:
                    yield from self._multi_get_group_plan(ks, g, consistency, out, deadline)
                except _Regroup:
                    again.extend(g)
            pending = again
        return out

    def _group_by_shard(self, keys: List[bytes], idx: List[int]) -> List[List[int]]:
        by_shard: Dict[int, int] = {}
        groups: List[List[int]] = []
        for i in idx:
            sh, _ = self._rt.locate(Target(keys[i]))
            if sh is None:
                groups.append([i])
                continue
            g = by_shard.get(sh.id)
            if g is None:
                g = by_shard[sh.id] = len(groups)
                groups.append([])
            groups[g].append(i)
        return groups

    def _multi_get_group_plan(
        self, keys: List[bytes], g: List[int], consistency: str, out: List[Optional[KeyValue]], deadline: _Deadline
    ) -> Plan[None]:
        req_keys = [keys[i] for i in g]
        gen = self._rt.generation()

        def attempt(a: _Attempt) -> Plan[Any]:
            if not all(a.shard.contains(k) for k in req_keys):
                raise _Regroup()
            try:
                return (yield from a.call("MultiGet", kv_pb2.MultiGetRequest(header=a.header, keys=req_keys)))
            except grpc.RpcError as e:
                if _Failure.of(e).cross_shard is not None:
                    # Our routing was wrong about the shard's range.
                    try:
                        yield _Refresh(deadline, gen)
                    except _NoNodeAnswered:
                        pass
                    raise _Regroup() from None
                raise

        resp = yield from self._invoke_plan(_Spec.read("multiget", consistency), Target(req_keys[0]), attempt, deadline)
        if len(resp.results) != len(req_keys):
            raise ShaleError(
                f"shard {resp.header.shard_id} answered {len(resp.results)} results for {len(req_keys)} keys",
                op="multiget",
            )
        for j, r in enumerate(resp.results):
            out[g[j]] = _kv_field(r, "kv")

    def _put_plan(
        self, key: Bytes, value: Bytes, ttl: Optional[TTL], prev_kv: bool, request_id: Optional[bytes], timeout: Optional[float]
    ) -> Plan[PutResult]:
        k, v = to_bytes(key), to_bytes(value, "value")
        ttl_ms = ttl_millis(ttl)
        spec = _Spec.for_write("put", request_id)

        def attempt(a: _Attempt) -> Plan[Any]:
            req = kv_pb2.PutRequest(header=a.header, key=k, value=v, ttl_ms=ttl_ms, prev_kv=prev_kv)
            return (yield from a.call("Put", req))

        resp = yield from self._invoke_plan(spec, Target(k), attempt, self._deadline(timeout))
        return PutResult(revision=resp.header.revision, prev_kv=_kv_field(resp, "prev_kv"))

    def _delete_plan(self, key: Bytes, prev_kv: bool, request_id: Optional[bytes], timeout: Optional[float]) -> Plan[DeleteResult]:
        k = to_bytes(key)
        spec = _Spec.for_write("delete", request_id)

        def attempt(a: _Attempt) -> Plan[Any]:
            return (yield from a.call("Delete", kv_pb2.DeleteRequest(header=a.header, key=k, prev_kv=prev_kv)))

        resp = yield from self._invoke_plan(spec, Target(k), attempt, self._deadline(timeout))
        return DeleteResult(revision=resp.header.revision, deleted=resp.deleted > 0, prev_kv=_kv_field(resp, "prev_kv"))

    def _delete_range_plan(self, start: Optional[Bytes], end: Optional[Bytes], timeout: Optional[float]) -> Plan[None]:
        s, e = to_bytes(start), to_bytes(end)
        if e and s >= e:
            raise InvalidArgument(f"empty range [{s!r}, {e!r}): start must be before end", op="delete-range")
        deadline = self._deadline(timeout)
        # The server requires a start key; keys are never empty, so b"\x00"
        # is the first of them all.
        cur = s or b"\x00"
        while True:
            shard_end = [b""]

            def attempt(a: _Attempt, cur: bytes = cur) -> Plan[Any]:
                part_end = e
                shard_end[0] = a.shard.desc.end_key
                if shard_end[0] and (not e or shard_end[0] < e):
                    part_end = shard_end[0]
                req = kv_pb2.DeleteRangeRequest(header=a.header, start_key=cur, end_key=part_end)
                return (yield from a.call("DeleteRange", req))

            yield from self._invoke_plan(_Spec.for_write("delete-range", None), Target(cur), attempt, deadline)
            if not shard_end[0] or (e and shard_end[0] >= e):
                return
            cur = shard_end[0]

    def _cas_plan(
        self,
        key: Bytes,
        expected: Optional[Bytes],
        new_value: Bytes,
        ttl: Optional[TTL],
        must_succeed: bool,
        request_id: Optional[bytes],
        timeout: Optional[float],
    ) -> Plan[CasResult]:
        k, nv = to_bytes(key), to_bytes(new_value, "value")
        exp = None if expected is None else to_bytes(expected, "value")
        ttl_ms = ttl_millis(ttl)
        spec = _Spec.for_write("compare-and-swap", request_id)

        def attempt(a: _Attempt) -> Plan[Any]:
            req = kv_pb2.CompareAndSwapRequest(
                header=a.header,
                key=k,
                expected_value=exp or b"",
                expect_absent=exp is None,
                new_value=nv,
                ttl_ms=ttl_ms,
            )
            return (yield from a.call("CompareAndSwap", req))

        resp = yield from self._invoke_plan(spec, Target(k), attempt, self._deadline(timeout))
        res = CasResult(succeeded=resp.succeeded, current=_kv_field(resp, "current"), revision=resp.header.revision)
        if must_succeed and not res.succeeded:
            raise CompareFailed(
                f"key {k!r}: the comparison failed (the key is {'absent' if res.current is None else 'present'})",
                current=res.current,
                op="compare-and-swap",
            )
        return res

    def _scan_plan(
        self,
        start: Optional[Bytes],
        end: Optional[Bytes],
        prefix: Optional[Bytes],
        reverse: bool,
        limit: Optional[int],
        keys_only: bool,
        page_size: Optional[int],
        consistency: str,
        timeout: Optional[float],
    ) -> Plan[None]:
        """The scan's plan, which yields an _Item per key; its arguments are
        checked when it is made (the first step runs at once)."""
        op = "scan"
        lo, hi = _scan_range(start, end, prefix, op)
        if limit is not None and limit < 0:
            raise InvalidArgument(f"negative limit {limit}", op=op)
        if page_size is not None and page_size < 0:
            raise InvalidArgument(f"negative page_size {page_size}", op=op)
        Consistency.to_proto(consistency)  # checks it
        return self._scan_pages(lo, hi, reverse, limit or 0, keys_only, page_size or 0, consistency, timeout)

    def _scan_pages(
        self,
        lo: bytes,
        hi: bytes,
        reverse: bool,
        limit: int,
        keys_only: bool,
        page_size: int,
        consistency: str,
        timeout: Optional[float],
    ) -> Plan[None]:
        yielded = 0
        token = b""
        resume = b""
        sub_lo = sub_hi = b""
        sub_limit = sub_got = 0
        while True:
            if not token:
                # A new sub-scan from the current position, followed shard to
                # shard by continuation tokens.
                if hi and lo >= hi:
                    return
                remaining = 0
                if limit:
                    remaining = limit - yielded
                    if remaining <= 0:
                        return
                sub_lo, sub_hi = lo, hi
                if page_size and (not remaining or page_size < remaining):
                    sub_limit = page_size
                else:
                    sub_limit = remaining
                sub_got = 0
            req = kv_pb2.ScanRequest(
                start_key=sub_lo,
                end_key=sub_hi,
                reverse=reverse,
                limit=min(sub_limit, 0xFFFFFFFF),
                continuation_token=token,
                keys_only=keys_only,
            )
            tg = Target(hi, before=True) if reverse else Target(lo)
            if token and resume:
                tg = Target(resume, before=reverse)

            def attempt(a: _Attempt, req: kv_pb2.ScanRequest = req) -> Plan[Any]:
                r = kv_pb2.ScanRequest()
                r.CopyFrom(req)
                r.header.CopyFrom(a.header)
                return (yield from a.call("Scan", r))

            resp = yield from self._invoke_plan(_Spec.read("scan", consistency), tg, attempt, self._deadline(timeout))
            kvs = list(resp.kvs)
            sub_got += len(kvs)
            last_empty = False
            if kvs:
                last = kvs[-1].key
                if reverse:
                    hi = last
                    last_empty = not last
                else:
                    lo = last + b"\x00"
            token, resume = resp.continuation_token, resp.resume_key
            del resp
            for kv in kvs:
                out = KeyValue.from_proto(kv)
                assert out is not None
                yield _Item(out)
                yielded += 1
                if limit and yielded >= limit:
                    return
            if token:
                continue
            # The sub-scan ended: short of its limit the range is exhausted;
            # with its limit reached the next starts after the last key.
            if not sub_limit or sub_got < sub_limit or last_empty:
                return

    def _txn_plan(self, txn: "_TxnBase", request_id: Optional[bytes], timeout: Optional[float]) -> Plan[TxnResult]:
        op = "txn"
        spec = _Spec.for_write(op, request_id)
        spans: List[Tuple[bytes, Optional[bytes]]] = [(c.key, None) for c in txn._compares]
        spans += [o.span() for o in txn._then] + [o.span() for o in txn._else]
        if not spans:
            raise InvalidArgument("empty transaction: no comparisons and no operations", op=op)
        req = kv_pb2.TxnRequest(
            compares=[c.to_proto() for c in txn._compares],
            success=[o.to_proto() for o in txn._then],
            failure=[o.to_proto() for o in txn._else],
        )

        def attempt(a: _Attempt) -> Plan[Any]:
            _check_one_shard(a.shard.desc, spans, op)
            r = kv_pb2.TxnRequest()
            r.CopyFrom(req)
            r.header.CopyFrom(a.header)
            return (yield from a.call("Txn", r))

        resp = yield from self._invoke_plan(spec, Target(spans[0][0]), attempt, self._deadline(timeout))
        return TxnResult(
            succeeded=resp.succeeded,
            revision=resp.header.revision,
            results=[OpResult.from_proto(r) for r in resp.results],
        )

    def _cluster_status_plan(self, timeout: Optional[float]) -> Plan[admin_pb2.ClusterStatusResponse]:
        def call(s: _Stubs, t: Optional[float]) -> Plan[Any]:
            return (yield from self._rpc_plan(s.admin.ClusterStatus, admin_pb2.ClusterStatusRequest(), t, []))

        return (yield from self._invoke_any_node_plan("cluster-status", False, call, timeout))  # type: ignore[no-any-return]


def _with_token(md: List[Tuple[str, str]], tok: str) -> List[Tuple[str, str]]:
    return md + [(_AUTHORIZATION_KEY, "Bearer " + tok)] if tok else md


class _TxnBase:
    """A transaction under construction: if all its comparisons hold, its
    ``then`` operations apply, else its ``else_`` operations, atomically.
    Every key it touches (compared or operated on, and the whole of every
    deleted range) must be in one shard; the client checks this against its
    routing before sending and raises :class:`shale.CrossShard` otherwise.
    Not safe for concurrent use."""

    def __init__(self, client: _Base) -> None:
        """A transaction that commit() runs on client."""
        self._client = client
        self._compares: List[Compare] = []
        self._then: List[Op] = []
        self._else: List[Op] = []

    def compare(self: TB, *cmps: Compare) -> TB:
        """Add comparisons; the transaction succeeds when all hold (none: it
        always succeeds). Build them with shale.Value, Version,
        CreateRevision, ModRevision, Exists, key_exists, key_missing."""
        for c in cmps:
            if not isinstance(c, Compare):
                raise InvalidArgument(
                    f"not a comparison: {c!r} (build one like shale.Value(key) == b'v' or shale.Version(key) > 0)",
                    op="txn",
                )
        self._compares.extend(cmps)
        return self

    def then(self: TB, *ops: Op) -> TB:
        """Add operations applied when the comparisons hold (shale.Put,
        shale.Delete, shale.DeleteRange, shale.Get)."""
        self._then.extend(_check_ops(ops))
        return self

    def else_(self: TB, *ops: Op) -> TB:
        """Add operations applied when a comparison fails."""
        self._else.extend(_check_ops(ops))
        return self


TB = TypeVar("TB", bound=_TxnBase)
