from shale.v1 import auth_pb2 as _auth_pb2
from shale.v1 import kv_pb2 as _kv_pb2
from shale.v1 import meta_pb2 as _meta_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
RAFT_FEATURE_COMPACT_COMMANDS: RaftFeature
RAFT_FEATURE_PACKED_ENTRIES: RaftFeature
RAFT_FEATURE_UNSPECIFIED: RaftFeature

class CommandResult(_message.Message):
    __slots__ = ["allocated_id", "descriptor", "error_code", "error_message", "right_descriptor", "txn"]
    ALLOCATED_ID_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RIGHT_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    TXN_FIELD_NUMBER: _ClassVar[int]
    allocated_id: int
    descriptor: _meta_pb2.ShardDescriptor
    error_code: int
    error_message: str
    right_descriptor: _meta_pb2.ShardDescriptor
    txn: _kv_pb2.TxnResponse
    def __init__(self, txn: _Optional[_Union[_kv_pb2.TxnResponse, _Mapping]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., descriptor: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ..., allocated_id: _Optional[int] = ..., right_descriptor: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ...) -> None: ...

class ConfChangeContext(_message.Message):
    __slots__ = ["replicas"]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[_meta_pb2.ReplicaDescriptor]
    def __init__(self, replicas: _Optional[_Iterable[_Union[_meta_pb2.ReplicaDescriptor, _Mapping]]] = ...) -> None: ...

class ExpireKeys(_message.Message):
    __slots__ = ["keys", "mod_revisions"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MOD_REVISIONS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    mod_revisions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., mod_revisions: _Optional[_Iterable[int]] = ...) -> None: ...

class HlcTimestamp(_message.Message):
    __slots__ = ["logical", "wall_nanos"]
    LOGICAL_FIELD_NUMBER: _ClassVar[int]
    WALL_NANOS_FIELD_NUMBER: _ClassVar[int]
    logical: int
    wall_nanos: int
    def __init__(self, wall_nanos: _Optional[int] = ..., logical: _Optional[int] = ...) -> None: ...

class MergeAbsorb(_message.Message):
    __slots__ = ["attempt", "begin", "commit", "dedup_ids", "dedup_results", "keys", "right", "right_revision", "values"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    DEDUP_IDS_FIELD_NUMBER: _ClassVar[int]
    DEDUP_RESULTS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    RIGHT_FIELD_NUMBER: _ClassVar[int]
    RIGHT_REVISION_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    attempt: bytes
    begin: bool
    commit: bool
    dedup_ids: _containers.RepeatedScalarFieldContainer[bytes]
    dedup_results: _containers.RepeatedScalarFieldContainer[bytes]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    right: _meta_pb2.ShardDescriptor
    right_revision: int
    values: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, right: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ..., begin: bool = ..., keys: _Optional[_Iterable[bytes]] = ..., values: _Optional[_Iterable[bytes]] = ..., commit: bool = ..., right_revision: _Optional[int] = ..., dedup_ids: _Optional[_Iterable[bytes]] = ..., dedup_results: _Optional[_Iterable[bytes]] = ..., attempt: _Optional[bytes] = ...) -> None: ...

class MergeFreeze(_message.Message):
    __slots__ = ["into_shard_id"]
    INTO_SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    into_shard_id: int
    def __init__(self, into_shard_id: _Optional[int] = ...) -> None: ...

class PutAuth(_message.Message):
    __slots__ = ["expected_revision", "state"]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    expected_revision: int
    state: _auth_pb2.AuthState
    def __init__(self, state: _Optional[_Union[_auth_pb2.AuthState, _Mapping]] = ..., expected_revision: _Optional[int] = ...) -> None: ...

class RaftCommand(_message.Message):
    __slots__ = ["epoch", "expire", "first_attempt", "hlc", "merge_absorb", "merge_freeze", "merge_retire", "noop", "put", "request_id", "split", "system", "timestamp_unix_nanos", "txn", "wall_offset_nanos"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_FIELD_NUMBER: _ClassVar[int]
    FIRST_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    HLC_FIELD_NUMBER: _ClassVar[int]
    MERGE_ABSORB_FIELD_NUMBER: _ClassVar[int]
    MERGE_FREEZE_FIELD_NUMBER: _ClassVar[int]
    MERGE_RETIRE_FIELD_NUMBER: _ClassVar[int]
    NOOP_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    TXN_FIELD_NUMBER: _ClassVar[int]
    WALL_OFFSET_NANOS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    expire: ExpireKeys
    first_attempt: bool
    hlc: HlcTimestamp
    merge_absorb: MergeAbsorb
    merge_freeze: MergeFreeze
    merge_retire: bool
    noop: bool
    put: _kv_pb2.PutOp
    request_id: bytes
    split: SplitCommand
    system: SystemCommand
    timestamp_unix_nanos: int
    txn: _kv_pb2.TxnRequest
    wall_offset_nanos: int
    def __init__(self, request_id: _Optional[bytes] = ..., timestamp_unix_nanos: _Optional[int] = ..., epoch: _Optional[int] = ..., first_attempt: bool = ..., hlc: _Optional[_Union[HlcTimestamp, _Mapping]] = ..., wall_offset_nanos: _Optional[int] = ..., txn: _Optional[_Union[_kv_pb2.TxnRequest, _Mapping]] = ..., system: _Optional[_Union[SystemCommand, _Mapping]] = ..., noop: bool = ..., split: _Optional[_Union[SplitCommand, _Mapping]] = ..., merge_freeze: _Optional[_Union[MergeFreeze, _Mapping]] = ..., merge_absorb: _Optional[_Union[MergeAbsorb, _Mapping]] = ..., merge_retire: bool = ..., expire: _Optional[_Union[ExpireKeys, _Mapping]] = ..., put: _Optional[_Union[_kv_pb2.PutOp, _Mapping]] = ...) -> None: ...

class RaftEnvelope(_message.Message):
    __slots__ = ["message", "shard_id"]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    message: bytes
    shard_id: int
    def __init__(self, shard_id: _Optional[int] = ..., message: _Optional[bytes] = ...) -> None: ...

class RaftMessageBatch(_message.Message):
    __slots__ = ["applying_backlog", "cluster_id", "features", "from_node_id", "hlc", "messages", "quiesced_shards", "to_node_id"]
    APPLYING_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HLC_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    QUIESCED_SHARDS_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    applying_backlog: bool
    cluster_id: str
    features: int
    from_node_id: int
    hlc: HlcTimestamp
    messages: _containers.RepeatedCompositeFieldContainer[RaftEnvelope]
    quiesced_shards: _containers.RepeatedScalarFieldContainer[int]
    to_node_id: int
    def __init__(self, cluster_id: _Optional[str] = ..., from_node_id: _Optional[int] = ..., to_node_id: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[RaftEnvelope, _Mapping]]] = ..., quiesced_shards: _Optional[_Iterable[int]] = ..., hlc: _Optional[_Union[HlcTimestamp, _Mapping]] = ..., features: _Optional[int] = ..., applying_backlog: bool = ...) -> None: ...

class RaftStreamResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ["crc32c", "data", "file_index", "header", "offset", "running_crc32c"]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FILE_INDEX_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    RUNNING_CRC32C_FIELD_NUMBER: _ClassVar[int]
    crc32c: int
    data: bytes
    file_index: int
    header: SnapshotHeader
    offset: int
    running_crc32c: int
    def __init__(self, header: _Optional[_Union[SnapshotHeader, _Mapping]] = ..., file_index: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., crc32c: _Optional[int] = ..., running_crc32c: _Optional[int] = ...) -> None: ...

class SnapshotFile(_message.Message):
    __slots__ = ["crc32c", "name", "size"]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    crc32c: int
    name: str
    size: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., crc32c: _Optional[int] = ...) -> None: ...

class SnapshotHeader(_message.Message):
    __slots__ = ["cluster_id", "descriptor", "files", "from_node_id", "hlc", "raft_message", "shard_id", "to_node_id"]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HLC_FIELD_NUMBER: _ClassVar[int]
    RAFT_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    descriptor: _meta_pb2.ShardDescriptor
    files: _containers.RepeatedCompositeFieldContainer[SnapshotFile]
    from_node_id: int
    hlc: HlcTimestamp
    raft_message: bytes
    shard_id: int
    to_node_id: int
    def __init__(self, cluster_id: _Optional[str] = ..., shard_id: _Optional[int] = ..., from_node_id: _Optional[int] = ..., to_node_id: _Optional[int] = ..., raft_message: _Optional[bytes] = ..., files: _Optional[_Iterable[_Union[SnapshotFile, _Mapping]]] = ..., descriptor: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ..., hlc: _Optional[_Union[HlcTimestamp, _Mapping]] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ["applied"]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    def __init__(self, applied: bool = ...) -> None: ...

class SplitCommand(_message.Message):
    __slots__ = ["automatic", "right_leader_node_id", "right_shard_id", "split_key"]
    AUTOMATIC_FIELD_NUMBER: _ClassVar[int]
    RIGHT_LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RIGHT_SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_KEY_FIELD_NUMBER: _ClassVar[int]
    automatic: bool
    right_leader_node_id: int
    right_shard_id: int
    split_key: bytes
    def __init__(self, split_key: _Optional[bytes] = ..., right_shard_id: _Optional[int] = ..., automatic: bool = ..., right_leader_node_id: _Optional[int] = ...) -> None: ...

class SystemCommand(_message.Message):
    __slots__ = ["allocate_shard_id", "put_auth", "put_node", "put_pin", "put_shard", "remove_node_id", "remove_shard_id"]
    ALLOCATE_SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    PUT_AUTH_FIELD_NUMBER: _ClassVar[int]
    PUT_NODE_FIELD_NUMBER: _ClassVar[int]
    PUT_PIN_FIELD_NUMBER: _ClassVar[int]
    PUT_SHARD_FIELD_NUMBER: _ClassVar[int]
    REMOVE_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REMOVE_SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    allocate_shard_id: int
    put_auth: PutAuth
    put_node: _meta_pb2.NodeDescriptor
    put_pin: _meta_pb2.ShardPin
    put_shard: _meta_pb2.ShardDescriptor
    remove_node_id: int
    remove_shard_id: int
    def __init__(self, put_node: _Optional[_Union[_meta_pb2.NodeDescriptor, _Mapping]] = ..., remove_node_id: _Optional[int] = ..., put_shard: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ..., allocate_shard_id: _Optional[int] = ..., put_pin: _Optional[_Union[_meta_pb2.ShardPin, _Mapping]] = ..., remove_shard_id: _Optional[int] = ..., put_auth: _Optional[_Union[PutAuth, _Mapping]] = ...) -> None: ...

class RaftFeature(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
