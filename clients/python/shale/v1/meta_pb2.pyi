from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
REPLICA_ROLE_LEARNER: ReplicaRole
REPLICA_ROLE_VOTER_INCOMING: ReplicaRole
REPLICA_ROLE_VOTER_OUTGOING: ReplicaRole
REPLICA_ROLE_VOTER_UNSPECIFIED: ReplicaRole

class CrossShardRequest(_message.Message):
    __slots__ = ["shard_id", "split_key"]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_KEY_FIELD_NUMBER: _ClassVar[int]
    shard_id: int
    split_key: bytes
    def __init__(self, split_key: _Optional[bytes] = ..., shard_id: _Optional[int] = ...) -> None: ...

class EpochMismatch(_message.Message):
    __slots__ = ["current", "next", "requested_epoch"]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    current: ShardDescriptor
    next: RoutedShard
    requested_epoch: int
    def __init__(self, requested_epoch: _Optional[int] = ..., current: _Optional[_Union[ShardDescriptor, _Mapping]] = ..., next: _Optional[_Union[RoutedShard, _Mapping]] = ...) -> None: ...

class KeyOutsideShard(_message.Message):
    __slots__ = ["key", "shard"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    shard: ShardDescriptor
    def __init__(self, key: _Optional[bytes] = ..., shard: _Optional[_Union[ShardDescriptor, _Mapping]] = ...) -> None: ...

class NodeDescriptor(_message.Message):
    __slots__ = ["address", "decommissioning", "node_id", "removed", "started", "zone"]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DECOMMISSIONING_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    address: str
    decommissioning: bool
    node_id: int
    removed: bool
    started: bool
    zone: str
    def __init__(self, node_id: _Optional[int] = ..., address: _Optional[str] = ..., zone: _Optional[str] = ..., removed: bool = ..., decommissioning: bool = ..., started: bool = ...) -> None: ...

class NotLeader(_message.Message):
    __slots__ = ["leader_address", "leader_node_id", "shard_id"]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    leader_address: str
    leader_node_id: int
    shard_id: int
    def __init__(self, shard_id: _Optional[int] = ..., leader_node_id: _Optional[int] = ..., leader_address: _Optional[str] = ...) -> None: ...

class ReplicaDescriptor(_message.Message):
    __slots__ = ["node_id", "replica_id", "role"]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    replica_id: int
    role: ReplicaRole
    def __init__(self, node_id: _Optional[int] = ..., replica_id: _Optional[int] = ..., role: _Optional[_Union[ReplicaRole, str]] = ...) -> None: ...

class RoutedShard(_message.Message):
    __slots__ = ["descriptor", "leader_node_id"]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    descriptor: ShardDescriptor
    leader_node_id: int
    def __init__(self, descriptor: _Optional[_Union[ShardDescriptor, _Mapping]] = ..., leader_node_id: _Optional[int] = ...) -> None: ...

class ShardDescriptor(_message.Message):
    __slots__ = ["auto_split", "end_key", "epoch", "merging_into", "next_replica_id", "range_changed_unix_nanos", "replicas", "retired", "shard_id", "start_key", "system"]
    AUTO_SPLIT_FIELD_NUMBER: _ClassVar[int]
    END_KEY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MERGING_INTO_FIELD_NUMBER: _ClassVar[int]
    NEXT_REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RANGE_CHANGED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    START_KEY_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    auto_split: bool
    end_key: bytes
    epoch: int
    merging_into: int
    next_replica_id: int
    range_changed_unix_nanos: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaDescriptor]
    retired: bool
    shard_id: int
    start_key: bytes
    system: bool
    def __init__(self, shard_id: _Optional[int] = ..., start_key: _Optional[bytes] = ..., end_key: _Optional[bytes] = ..., epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaDescriptor, _Mapping]]] = ..., next_replica_id: _Optional[int] = ..., system: bool = ..., merging_into: _Optional[int] = ..., retired: bool = ..., auto_split: bool = ..., range_changed_unix_nanos: _Optional[int] = ...) -> None: ...

class ShardNotFound(_message.Message):
    __slots__ = ["node_id", "shard_id"]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    shard_id: int
    def __init__(self, shard_id: _Optional[int] = ..., node_id: _Optional[int] = ...) -> None: ...

class ShardPin(_message.Message):
    __slots__ = ["move_from_node_id", "move_to_node_id", "reason", "shard_id", "until_unix_nanos"]
    MOVE_FROM_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MOVE_TO_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    move_from_node_id: int
    move_to_node_id: int
    reason: str
    shard_id: int
    until_unix_nanos: int
    def __init__(self, shard_id: _Optional[int] = ..., until_unix_nanos: _Optional[int] = ..., reason: _Optional[str] = ..., move_from_node_id: _Optional[int] = ..., move_to_node_id: _Optional[int] = ...) -> None: ...

class WatchInterrupted(_message.Message):
    __slots__ = ["compact_revision", "resume_revision", "shard_id"]
    COMPACT_REVISION_FIELD_NUMBER: _ClassVar[int]
    RESUME_REVISION_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    compact_revision: int
    resume_revision: int
    shard_id: int
    def __init__(self, shard_id: _Optional[int] = ..., resume_revision: _Optional[int] = ..., compact_revision: _Optional[int] = ...) -> None: ...

class ReplicaRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
