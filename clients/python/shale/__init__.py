"""Shale's Python SDK.

``shale.Client`` is a synchronous client for a Shale cluster with the Go
SDK's behaviour: a routing cache learned from any node, leader following,
retries with backoff inside the call's deadline, request IDs so that a
retried write applies once, and the same rules for which errors are retried
and which outcomes are unknown. See docs/python.md::

    import shale

    with shale.Client(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]) as c:
        c.put(b"greeting", b"hello")
        kv = c.get(b"greeting")            # a KeyValue, or None when absent
        for kv in c.scan(prefix=b"user/"):
            ...

``Client.watch`` follows a key range's changes (an iterator that resumes
across shards, splits, merges and node restarts, or raises
``shale.Compacted``); ``shale.aio.Client`` is the same client for asyncio::

    async with shale.aio.Client(endpoints) as c:
        await c.put(b"k", b"v")
        async for resp in c.watch(prefix=b"user/"):
            ...

The package also holds the code generated from Shale's protocol
(``make proto``): ``shale.v1`` (the messages and gRPC stubs of
proto/shale/v1: KV, Admin, Auth) and ``shale.rpc`` (wire-compatible
``google.rpc.Status`` and ``ErrorInfo``). It runs on Debian's python3-grpcio
(1.51) and python3-protobuf (Python package 4.21) and newer.
"""

from shale.client import DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_TIMEOUT, Client, TLSConfig, Txn, Watcher
from shale.errors import (
    ClientClosed,
    Compacted,
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
)
from shale.types import (
    CasResult,
    Compare,
    Consistency,
    CreateRevision,
    Delete,
    DeleteRange,
    DeleteResult,
    EventType,
    Exists,
    Get,
    KeyValue,
    ModRevision,
    Op,
    OpResult,
    Put,
    PutResult,
    TxnResult,
    Value,
    Version,
    WatchEvent,
    WatchResponse,
    key_exists,
    key_missing,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "TLSConfig",
    "Txn",
    "Watcher",
    "DEFAULT_TIMEOUT",
    "DEFAULT_ATTEMPT_TIMEOUT",
    # errors
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
    # values
    "EventType",
    "WatchEvent",
    "WatchResponse",
    "KeyValue",
    "PutResult",
    "DeleteResult",
    "CasResult",
    "OpResult",
    "TxnResult",
    "Consistency",
    # transactions
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
]
