"""The values the Shale client takes and returns: keys, key-values, write
results, and the comparisons and operations of transactions."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from typing import List, Optional, Union

from shale.errors import InvalidArgument
from shale.v1 import kv_pb2

__all__ = [
    "Bytes",
    "KeyValue",
    "PutResult",
    "DeleteResult",
    "CasResult",
    "OpResult",
    "TxnResult",
    "Consistency",
    "Compare",
    "Value",
    "Version",
    "CreateRevision",
    "ModRevision",
    "Exists",
    "key_exists",
    "key_missing",
    "Op",
    "Put",
    "Delete",
    "DeleteRange",
    "Get",
    "to_bytes",
    "ttl_millis",
    "EventType",
    "WatchEvent",
    "WatchResponse",
]

#: A key or value as the client accepts it: bytes (or bytearray, memoryview),
#: or str, which is encoded as UTF-8. Keys and values come back as bytes.
Bytes = Union[bytes, bytearray, memoryview, str]

#: A TTL: seconds (int or float) or a datetime.timedelta.
TTL = Union[int, float, datetime.timedelta]


def to_bytes(b: Optional[Bytes], what: str = "key") -> bytes:
    """Convert a key or value to bytes (str as UTF-8; None as b"")."""
    if b is None:
        return b""
    if isinstance(b, bytes):
        return b
    if isinstance(b, str):
        return b.encode("utf-8")
    if isinstance(b, (bytearray, memoryview)):
        return bytes(b)
    raise TypeError(f"shale: {what} must be bytes or str, not {type(b).__name__}")


def ttl_millis(ttl: Optional[TTL]) -> int:
    """Convert a TTL to the wire's whole milliseconds, rounding up; None or 0
    is 0 (never expires). A negative TTL is InvalidArgument."""
    if ttl is None:
        return 0
    secs = ttl.total_seconds() if isinstance(ttl, datetime.timedelta) else float(ttl)
    if secs < 0 or math.isnan(secs):
        raise InvalidArgument(f"negative TTL {ttl!r}")
    return int(math.ceil(secs * 1000))


class Consistency:
    """How a read is ordered against writes (the values are plain strings)."""

    #: Reflects every write acknowledged before the read started; served by
    #: the shard's leader. The default.
    LINEARIZABLE = "linearizable"
    #: Linearizable too, but any replica may serve it (after a ReadIndex
    #: round trip to the leader).
    FOLLOWER = "follower"
    #: A replica's applied state without coordination: may miss recent
    #: writes, needs no leader.
    STALE = "stale"

    @staticmethod
    def to_proto(c: str) -> int:
        """The wire's ReadConsistency value of ``c``."""
        try:
            return {
                Consistency.LINEARIZABLE: kv_pb2.READ_CONSISTENCY_LINEARIZABLE_UNSPECIFIED,
                Consistency.FOLLOWER: kv_pb2.READ_CONSISTENCY_FOLLOWER,
                Consistency.STALE: kv_pb2.READ_CONSISTENCY_STALE,
            }[c]
        except KeyError:
            raise InvalidArgument(f"unknown consistency {c!r} (want linearizable, follower or stale)") from None


@dataclass(frozen=True)
class KeyValue:
    """A key with its value and revisions, as stored by the shard that holds it.

    Revisions are per shard: comparable between keys of one shard only.
    """

    #: The key.
    key: bytes
    #: The value (b"" for scans with keys_only).
    value: bytes
    #: The shard revision of the write that created the key (since it was last absent).
    create_revision: int
    #: The shard revision of the last write to the key.
    mod_revision: int
    #: The number of writes to the key since its creation (1 after the creating write).
    version: int
    #: When the key expires (its TTL), as an aware UTC datetime; None for never.
    expire_at: Optional[datetime.datetime] = None

    @staticmethod
    def from_proto(kv: Optional[kv_pb2.KeyValue]) -> Optional["KeyValue"]:
        """Convert a ``shale.v1.KeyValue`` message (None stays None)."""
        if kv is None:
            return None
        exp = None
        if kv.expire_unix_nanos:
            exp = datetime.datetime.fromtimestamp(kv.expire_unix_nanos / 1e9, tz=datetime.timezone.utc)
        return KeyValue(
            key=kv.key,
            value=kv.value,
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
            version=kv.version,
            expire_at=exp,
        )


class EventType:
    """What a watched change did: :attr:`PUT` or :attr:`DELETE`."""

    #: A value was written.
    PUT = "PUT"
    #: The key was removed: a delete, a delete_range covering it, or its
    #: expiry (deleted by its shard's leader as a write with its own revision).
    DELETE = "DELETE"


@dataclass(frozen=True)
class WatchEvent:
    """One change to a watched key."""

    #: EventType.PUT or EventType.DELETE.
    type: str
    #: The key after the change: its value and revisions for a put; for a
    #: delete, the key with mod_revision the deletion's revision.
    kv: KeyValue
    #: The key before the change (with ``prev_kv=True``; None when it was absent).
    prev_kv: Optional[KeyValue] = None

    @staticmethod
    def from_proto(e: kv_pb2.WatchEvent) -> "WatchEvent":
        """Convert a ``shale.v1.WatchEvent`` message."""
        kv = KeyValue.from_proto(e.kv)
        assert kv is not None
        t = EventType.DELETE if e.type == kv_pb2.WatchEvent.TYPE_DELETE else EventType.PUT
        return WatchEvent(type=t, kv=kv, prev_kv=_kv_field(e, "prev_kv"))


@dataclass(frozen=True)
class WatchResponse:
    """A step of a watch: changes of one shard's part of the range, in
    revision order. Responses of different shards interleave; changes to one
    key always come in its revision order, across splits and merges too."""

    #: The shard the changes come from.
    shard_id: int
    #: Every change to the shard's part of the range at or below it has been
    #: delivered (revisions are per shard).
    revision: int
    #: The changes; none in a progress notification.
    events: List[WatchEvent] = field(default_factory=list)


def _kv_field(msg: object, name: str) -> Optional[KeyValue]:
    """The KeyValue in field ``name`` of msg, None when unset."""
    if msg.HasField(name):  # type: ignore[attr-defined]
        return KeyValue.from_proto(getattr(msg, name))
    return None


@dataclass(frozen=True)
class PutResult:
    """The outcome of a put."""

    #: The shard revision at which the write applied.
    revision: int
    #: The previous key-value with prev_kv=True; None otherwise or when the key was absent.
    prev_kv: Optional[KeyValue] = None


@dataclass(frozen=True)
class DeleteResult:
    """The outcome of a delete."""

    #: The shard revision at which the delete applied.
    revision: int
    #: Whether the key existed.
    deleted: bool
    #: The deleted key-value with prev_kv=True; None otherwise or when the key was absent.
    prev_kv: Optional[KeyValue] = None


@dataclass(frozen=True)
class CasResult:
    """The outcome of a compare-and-swap."""

    #: Whether the swap happened.
    succeeded: bool
    #: The key's value before the operation, None when it was absent.
    current: Optional[KeyValue]
    #: The shard revision after the operation.
    revision: int

    def __bool__(self) -> bool:
        """A CasResult is true when the swap happened."""
        return self.succeeded


@dataclass(frozen=True)
class OpResult:
    """The result of the transaction operation at the same position."""

    #: "put", "delete", "delete_range" or "get".
    type: str
    #: The shard revision of the write (for reads, the revision read at).
    revision: int
    #: The value a Get read, None when the key is absent.
    kv: Optional[KeyValue] = None
    #: The previous value of a Put or Delete with prev_kv=True.
    prev_kv: Optional[KeyValue] = None
    #: Whether a Delete removed an existing key.
    deleted: bool = False

    @staticmethod
    def from_proto(r: kv_pb2.ResponseOp) -> "OpResult":
        """Convert a ``shale.v1.ResponseOp``."""
        which = r.WhichOneof("op")
        if which == "put":
            return OpResult("put", r.put.header.revision, prev_kv=_kv_field(r.put, "prev_kv"))
        if which == "delete":
            return OpResult(
                "delete", r.delete.header.revision, prev_kv=_kv_field(r.delete, "prev_kv"), deleted=r.delete.deleted > 0
            )
        if which == "delete_range":
            return OpResult("delete_range", r.delete_range.header.revision)
        if which == "get":
            return OpResult("get", r.get.header.revision, kv=_kv_field(r.get, "kv"))
        return OpResult(str(which), 0)


@dataclass(frozen=True)
class TxnResult:
    """The outcome of a committed transaction."""

    #: Whether every comparison held (and so which branch applied: then's or else's).
    succeeded: bool
    #: The shard revision after the transaction.
    revision: int
    #: One result per operation of the branch taken, in order.
    results: List[OpResult] = field(default_factory=list)

    def __bool__(self) -> bool:
        """A TxnResult is true when its comparisons held."""
        return self.succeeded


# --- Transaction comparisons -------------------------------------------------


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction. Build it from :class:`Value`,
    :class:`Version`, :class:`CreateRevision`, :class:`ModRevision` or
    :class:`Exists` and a comparison (``==``, ``!=``, ``>``, ``<``, or the
    methods ``equal``, ``not_equal``, ``greater``, ``less``), or with
    :func:`key_exists` and :func:`key_missing`."""

    #: The key compared.
    key: bytes
    #: The wire's Compare.Target.
    target: int
    #: The wire's Compare.Result.
    result: int
    #: The value compared with (Value comparisons).
    value: bytes = b""
    #: The number compared with (the other targets).
    number: int = 0

    def to_proto(self) -> kv_pb2.Compare:
        """The ``shale.v1.Compare`` message."""
        return kv_pb2.Compare(
            key=self.key,
            target=self.target,  # type: ignore[arg-type]  # the enum's int value
            result=self.result,  # type: ignore[arg-type]
            value=self.value,
            number=self.number,
        )


_EQ = kv_pb2.Compare.RESULT_EQUAL_UNSPECIFIED
_NE = kv_pb2.Compare.RESULT_NOT_EQUAL
_GT = kv_pb2.Compare.RESULT_GREATER
_LT = kv_pb2.Compare.RESULT_LESS


class Value:
    """Starts a bytewise comparison of a key's value: ``Value(k) == b"v"``.
    An absent key fails every value comparison."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, key: Bytes) -> None:
        """Compare the value of ``key``."""
        self.key = to_bytes(key)

    def _cmp(self, result: int, x: Bytes) -> Compare:
        return Compare(self.key, kv_pb2.Compare.TARGET_VALUE_UNSPECIFIED, result, value=to_bytes(x, "value"))

    def equal(self, x: Bytes) -> Compare:
        """Holds when the value equals x."""
        return self._cmp(_EQ, x)

    def not_equal(self, x: Bytes) -> Compare:
        """Holds when the value differs from x."""
        return self._cmp(_NE, x)

    def greater(self, x: Bytes) -> Compare:
        """Holds when the value sorts after x."""
        return self._cmp(_GT, x)

    def less(self, x: Bytes) -> Compare:
        """Holds when the value sorts before x."""
        return self._cmp(_LT, x)

    __eq__ = equal  # type: ignore[assignment]
    __ne__ = not_equal  # type: ignore[assignment]
    __gt__ = greater
    __lt__ = less


class _NumberCmp:
    """A comparison of one of a key's numbers (absent keys have 0)."""

    __hash__ = None  # type: ignore[assignment]
    _target = 0

    def __init__(self, key: Bytes) -> None:
        """Compare the number of ``key``."""
        self.key = to_bytes(key)

    def _cmp(self, result: int, x: int) -> Compare:
        if isinstance(x, bool):
            x = int(x)
        if not isinstance(x, int) or x < 0:
            raise InvalidArgument(f"a {type(self).__name__} comparison needs a non-negative int, got {x!r}")
        return Compare(self.key, self._target, result, number=x)

    def equal(self, x: int) -> Compare:
        """Holds when the number equals x."""
        return self._cmp(_EQ, x)

    def not_equal(self, x: int) -> Compare:
        """Holds when the number differs from x."""
        return self._cmp(_NE, x)

    def greater(self, x: int) -> Compare:
        """Holds when the number is above x."""
        return self._cmp(_GT, x)

    def less(self, x: int) -> Compare:
        """Holds when the number is below x."""
        return self._cmp(_LT, x)

    __eq__ = equal  # type: ignore[assignment]
    __ne__ = not_equal  # type: ignore[assignment]
    __gt__ = greater
    __lt__ = less


class Version(_NumberCmp):
    """Starts a comparison of a key's version (writes since creation): ``Version(k) == 0``."""

    _target = kv_pb2.Compare.TARGET_VERSION


class CreateRevision(_NumberCmp):
    """Starts a comparison of a key's create revision."""

    _target = kv_pb2.Compare.TARGET_CREATE_REVISION


class ModRevision(_NumberCmp):
    """Starts a comparison of a key's last modification revision."""

    _target = kv_pb2.Compare.TARGET_MOD_REVISION


class Exists(_NumberCmp):
    """Starts a comparison of a key's existence as a number: 1 when present,
    0 when absent (``Exists(k) == 1`` holds when k exists)."""

    _target = kv_pb2.Compare.TARGET_EXISTS


def key_exists(key: Bytes) -> Compare:
    """A comparison that holds when ``key`` is present."""
    return Exists(key).equal(1)


def key_missing(key: Bytes) -> Compare:
    """A comparison that holds when ``key`` is absent."""
    return Exists(key).equal(0)


# --- Transaction operations --------------------------------------------------


class Op:
    """One operation of a transaction: :class:`Put`, :class:`Delete`,
    :class:`DeleteRange` or :class:`Get`."""

    def to_proto(self) -> kv_pb2.RequestOp:
        """The ``shale.v1.RequestOp`` message."""
        raise NotImplementedError

    def span(self) -> "tuple[bytes, Optional[bytes]]":
        """The key (end None) or range [start, end) the operation touches; end b"" is the end of the key space."""
        raise NotImplementedError


class Put(Op):
    """Sets ``key`` to ``value`` (with an optional TTL in seconds and prev_kv)."""

    def __init__(self, key: Bytes, value: Bytes, *, ttl: Optional[TTL] = None, prev_kv: bool = False) -> None:
        """A put of key; see :meth:`shale.Client.put` for ttl and prev_kv."""
        self.key = to_bytes(key)
        self.value = to_bytes(value, "value")
        self.ttl_ms = ttl_millis(ttl)
        self.prev_kv = prev_kv

    def to_proto(self) -> kv_pb2.RequestOp:
        """The ``shale.v1.RequestOp`` message."""
        return kv_pb2.RequestOp(put=kv_pb2.PutOp(key=self.key, value=self.value, ttl_ms=self.ttl_ms, prev_kv=self.prev_kv))

    def span(self) -> "tuple[bytes, Optional[bytes]]":
        """The key."""
        return self.key, None


class Delete(Op):
    """Removes ``key`` (with prev_kv, returns its previous value)."""

    def __init__(self, key: Bytes, *, prev_kv: bool = False) -> None:
        """A delete of key."""
        self.key = to_bytes(key)
        self.prev_kv = prev_kv

    def to_proto(self) -> kv_pb2.RequestOp:
        """The ``shale.v1.RequestOp`` message."""
        return kv_pb2.RequestOp(delete=kv_pb2.DeleteOp(key=self.key, prev_kv=self.prev_kv))

    def span(self) -> "tuple[bytes, Optional[bytes]]":
        """The key."""
        return self.key, None


class DeleteRange(Op):
    """Removes every key in [start, end), which must lie within the
    transaction's shard (an empty end is the end of the key space, so the
    shard must be the last)."""

    def __init__(self, start: Bytes, end: Optional[Bytes]) -> None:
        """A delete of [start, end); an inverted range is InvalidArgument."""
        self.start = to_bytes(start)
        self.end = to_bytes(end)
        if self.end and self.start >= self.end:
            raise InvalidArgument(f"empty range [{self.start!r}, {self.end!r}): start must be before end")

    def to_proto(self) -> kv_pb2.RequestOp:
        """The ``shale.v1.RequestOp`` message."""
        return kv_pb2.RequestOp(delete_range=kv_pb2.DeleteRangeOp(start_key=self.start, end_key=self.end))

    def span(self) -> "tuple[bytes, Optional[bytes]]":
        """The range."""
        return self.start, self.end


class Get(Op):
    """Reads ``key`` within a transaction (its result is in OpResult.kv)."""

    def __init__(self, key: Bytes) -> None:
        """A read of key."""
        self.key = to_bytes(key)

    def to_proto(self) -> kv_pb2.RequestOp:
        """The ``shale.v1.RequestOp`` message."""
        return kv_pb2.RequestOp(get=kv_pb2.GetOp(key=self.key))

    def span(self) -> "tuple[bytes, Optional[bytes]]":
        """The key."""
        return self.key, None
