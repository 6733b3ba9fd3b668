"""Shale's exceptions: one hierarchy rooted at :class:`ShaleError`.

Every exception the client raises for a failed call is a :class:`ShaleError`.
Those that come from a server answer carry its gRPC status code
(:attr:`ShaleError.code`), message (:attr:`ShaleError.message`) and the typed
details decoded from the ``grpc-status-details-bin`` trailer
(:attr:`ShaleError.details`: ``shale.v1.NotLeader``, ``EpochMismatch``,
``KeyOutsideShard``, ``ShardNotFound``, ``CrossShardRequest``,
``WatchInterrupted`` and ``shale.rpc.ErrorInfo`` messages)::

    ShaleError
    ├── InvalidArgument          malformed request; never retried
    │   └── CrossShard           a transaction spanning shards
    ├── NotFound                 (also a KeyError) get(..., must_exist=True) of an absent key
    ├── CompareFailed            cas(..., must_succeed=True) whose comparison failed
    ├── Unavailable              retries ran out (max_attempts), or no node reachable
    │   └── DeadlineExceeded     (also a TimeoutError) the call's deadline passed while retrying
    ├── OutcomeUnknown           a write that may or may not have applied
    ├── PermissionDenied         the user's roles do not allow the call; never retried
    ├── Unauthenticated          no valid identity (wrong password, ...); never retried
    ├── NotLeader                only as Unavailable.last, when leadership kept moving
    ├── Compacted                a watch's history is gone: it ends the watch, never a gap
    └── ClientClosed             the Client was closed

The rules for what is retried and what leaves a write's outcome unknown are
the Go SDK's (docs/client.md, "Errors" and "Did my write apply?"); see
docs/python.md.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

import grpc
from google.protobuf.message import Message

from shale.rpc import status_pb2
from shale.v1 import meta_pb2

__all__ = [
    "ShaleError",
    "InvalidArgument",
    "CrossShard",
    "NotFound",
    "CompareFailed",
    "Unavailable",
    "DeadlineExceeded",
    "OutcomeUnknown",
    "PermissionDenied",
    "Unauthenticated",
    "NotLeader",
    "Compacted",
    "ClientClosed",
    "ERROR_DOMAIN",
    "REASON_WRONG_NODE",
    "decode_details",
]

#: The domain of the ``google.rpc.ErrorInfo`` details Shale attaches to errors.
ERROR_DOMAIN = "shale-db.dev"
#: The ErrorInfo reason of a call refused because it named another node.
REASON_WRONG_NODE = "WRONG_NODE"

_DETAILS_KEY = "grpc-status-details-bin"

# The detail messages the client knows, by type_url. Others are skipped:
# new ones may be added.
_KNOWN_DETAILS: Tuple[Any, ...] = (
    meta_pb2.NotLeader,
    meta_pb2.EpochMismatch,
    meta_pb2.KeyOutsideShard,
    meta_pb2.ShardNotFound,
    meta_pb2.CrossShardRequest,
    meta_pb2.WatchInterrupted,
)
_DETAIL_TYPES: Dict[str, Type[Message]] = {"type.googleapis.com/" + cls.DESCRIPTOR.full_name: cls for cls in _KNOWN_DETAILS}
_DETAIL_TYPES["type.googleapis.com/google.rpc.ErrorInfo"] = status_pb2.ErrorInfo


def decode_details(err: grpc.RpcError) -> Tuple[Message, ...]:
    """Return the typed details of a failed gRPC call.

    The ``grpc-status-details-bin`` trailer is a serialized
    ``google.rpc.Status`` whose details are ``Any`` messages; those of a
    known type are decoded, the others skipped.
    """
    trailers = getattr(err, "trailing_metadata", None)
    md = trailers() if callable(trailers) else None
    for key, value in md or ():
        if key == _DETAILS_KEY:
            if isinstance(value, str):  # never for a -bin key, but be safe
                value = value.encode("latin-1")
            st = status_pb2.Status.FromString(value)
            out: List[Message] = []
            for d in st.details:
                cls = _DETAIL_TYPES.get(d.type_url)
                if cls is not None:
                    out.append(cls.FromString(d.value))
            return tuple(out)
    return ()


class ShaleError(Exception):
    """The root of every exception the Shale client raises.

    Attributes:
        message: what went wrong, as the server or the client said it.
        code: the gRPC status code of the server's answer, or None for an
            error the client found by itself (an argument check, a closed
            client).
        details: the typed details of the server's answer (protobuf
            messages of ``shale.v1`` and ``shale.rpc``), empty if none.
        op: the client operation that failed (``"put"``, ``"scan"``, ...),
            or None.
    """

    def __init__(
        self,
        message: str,
        *,
        code: Optional[grpc.StatusCode] = None,
        details: Sequence[Message] = (),
        op: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message: str = message
        self.code: Optional[grpc.StatusCode] = code
        self.details: Tuple[Message, ...] = tuple(details)
        self.op: Optional[str] = op

    def detail(self, cls: Type[Message]) -> Optional[Message]:
        """Return the first detail of type ``cls`` (a generated message class), or None."""
        for d in self.details:
            if isinstance(d, cls):
                return d
        return None

    def __str__(self) -> str:
        prefix = f"shale: {self.op}: " if self.op else "shale: "
        code = f"{self.code.name}: " if self.code is not None else ""
        return prefix + code + self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class InvalidArgument(ShaleError):
    """A malformed request: the server's INVALID_ARGUMENT, a request over a
    node's message size limit (``message larger than max``), or one of the
    client's own argument checks (inverted range, negative TTL, prefix with
    bounds, bad request ID, empty transaction). Never retried: the same
    request would fail the same way."""


class CrossShard(InvalidArgument):
    """A transaction or multi-key request whose keys span more than one shard.

    Attributes:
        split_key: the shard boundary the request crosses.
        shard_id: the shard the request was addressed to.
    """

    def __init__(self, message: str, *, split_key: bytes, shard_id: int, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.split_key: bytes = split_key
        self.shard_id: int = shard_id


class NotFound(ShaleError, KeyError):
    """A key that is absent (never written, deleted or expired), raised by
    ``Client.get(key, must_exist=True)``; plain ``get`` returns None instead.
    Also a :class:`KeyError`. Server NOT_FOUND answers that are not routing
    errors (which the client handles itself) are raised as this too.

    Attributes:
        key: the key, when the client knows it.
    """

    def __init__(self, message: str, *, key: Optional[bytes] = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.key: Optional[bytes] = key

    __str__ = ShaleError.__str__


class CompareFailed(ShaleError):
    """A compare-and-swap whose comparison did not hold, raised by
    ``Client.cas(..., must_succeed=True)``; plain ``cas`` returns a result
    with ``succeeded`` False instead. Nothing was written.

    Attributes:
        current: the key's value at the time (a KeyValue), None if absent.
    """

    def __init__(self, message: str, *, current: object = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.current = current


class Unavailable(ShaleError):
    """A call whose retries ran out without success: the cluster could not
    serve it (no quorum, unreachable replicas, leadership moving, overload)
    within ``max_attempts`` attempts, or no endpoint could be reached at
    connect. The subclass :class:`DeadlineExceeded` is raised when the call's
    deadline ended the retries.

    Attributes:
        last: the last attempt's error (a ShaleError), None if there was none.
    """

    def __init__(self, message: str, *, last: Optional[ShaleError] = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.last: Optional[ShaleError] = last


class DeadlineExceeded(Unavailable, TimeoutError):
    """The call's deadline (its ``timeout``, or the client's default) passed
    while it was retrying. Also a :class:`TimeoutError`."""

    __str__ = ShaleError.__str__


class OutcomeUnknown(ShaleError):
    """A write that failed after one of its attempts may have applied: the
    reply was lost, the deadline cut it short, or the node answered
    UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL or UNKNOWN after it may have
    proposed it. Any other exception from a write means it did not apply.

    To settle it, read the data back, or send the write again with the same
    ``request_id=``: a request ID applies at most once.

    Attributes:
        cause: the error that ended the call (for example a DeadlineExceeded,
            or a PermissionDenied of a later attempt).
        request_id: the request ID every attempt of the write carried.
    """

    def __init__(self, message: str, *, cause: ShaleError, request_id: bytes, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.cause: ShaleError = cause
        self.request_id: bytes = request_id


class PermissionDenied(ShaleError):
    """The server's PERMISSION_DENIED: the user's roles do not allow the keys
    (or the call needs the root role). Nothing was changed; never retried."""


class Unauthenticated(ShaleError):
    """The server's UNAUTHENTICATED: a wrong user name or password, no token
    or client certificate while the cluster's authentication is enabled, a
    token refused again after a renewal. Never retried."""


class NotLeader(ShaleError):
    """A replica that is not the shard's leader answered. The client follows
    leaders itself, so this is seen only as :attr:`Unavailable.last` when
    leadership kept moving until the deadline.

    Attributes:
        shard_id: the shard addressed.
        leader_node_id: the leader the replica knew of, 0 if none.
        leader_address: that leader's address, "" if unknown.
    """

    def __init__(
        self, message: str, *, shard_id: int = 0, leader_node_id: int = 0, leader_address: str = "", **kw: object
    ) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.shard_id: int = shard_id
        self.leader_node_id: int = leader_node_id
        self.leader_address: str = leader_address


class Compacted(ShaleError):
    """The history a watch would resume from is gone (the Go SDK's
    ErrCompacted): a shard no longer keeps the changes from the revision the
    watch needs (its log was truncated past it, or a merge carried them
    without their history). It ends the watch instead of a silent gap: read
    the range again and watch from that read's revision.

    Attributes:
        shard_id: the shard that refused the watch.
        revision: the first revision the watch still needed.
        compact_revision: the oldest revision the shard can still serve a
            watch of the range from (the detail's compact_revision; 0 when
            the shard did not say).
    """

    def __init__(self, message: str, *, shard_id: int = 0, revision: int = 0, compact_revision: int = 0, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.shard_id: int = shard_id
        self.revision: int = revision
        self.compact_revision: int = compact_revision


class ClientClosed(ShaleError):
    """A call made on (or interrupted by) a closed :class:`shale.Client`."""
