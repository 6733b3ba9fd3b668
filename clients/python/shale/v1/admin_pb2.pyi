from shale.v1 import auth_pb2 as _auth_pb2
from shale.v1 import meta_pb2 as _meta_pb2
from shale.v1 import raft_pb2 as _raft_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AddNodeRequest(_message.Message):
    __slots__ = ["address", "zone"]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    address: str
    zone: str
    def __init__(self, address: _Optional[str] = ..., zone: _Optional[str] = ...) -> None: ...

class AddNodeResponse(_message.Message):
    __slots__ = ["cluster_id", "node", "peers"]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    node: _meta_pb2.NodeDescriptor
    peers: _containers.RepeatedCompositeFieldContainer[_meta_pb2.NodeDescriptor]
    def __init__(self, node: _Optional[_Union[_meta_pb2.NodeDescriptor, _Mapping]] = ..., cluster_id: _Optional[str] = ..., peers: _Optional[_Iterable[_Union[_meta_pb2.NodeDescriptor, _Mapping]]] = ...) -> None: ...

class BackupLogEntry(_message.Message):
    __slots__ = ["hlc", "index", "ops", "range", "revision", "term"]
    HLC_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    RANGE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    hlc: _raft_pb2.HlcTimestamp
    index: int
    ops: _containers.RepeatedCompositeFieldContainer[BackupLogOp]
    range: _meta_pb2.ShardDescriptor
    revision: int
    term: int
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., hlc: _Optional[_Union[_raft_pb2.HlcTimestamp, _Mapping]] = ..., revision: _Optional[int] = ..., ops: _Optional[_Iterable[_Union[BackupLogOp, _Mapping]]] = ..., range: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ...) -> None: ...

class BackupLogOp(_message.Message):
    __slots__ = ["key", "kind", "value"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    kind: int
    value: bytes
    def __init__(self, kind: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class BackupShardLogRequest(_message.Message):
    __slots__ = ["after_index", "shard_id"]
    AFTER_INDEX_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    after_index: int
    shard_id: int
    def __init__(self, shard_id: _Optional[int] = ..., after_index: _Optional[int] = ...) -> None: ...

class BackupShardRequest(_message.Message):
    __slots__ = ["shard_id", "skip_files"]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    SKIP_FILES_FIELD_NUMBER: _ClassVar[int]
    shard_id: int
    skip_files: _containers.RepeatedCompositeFieldContainer[_raft_pb2.SnapshotFile]
    def __init__(self, shard_id: _Optional[int] = ..., skip_files: _Optional[_Iterable[_Union[_raft_pb2.SnapshotFile, _Mapping]]] = ...) -> None: ...

class BackupShardToRequest(_message.Message):
    __slots__ = ["backup_id", "location", "s3_credentials", "shard_id", "skip_files", "token"]
    BACKUP_ID_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    S3_CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    SKIP_FILES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    backup_id: str
    location: str
    s3_credentials: S3Credentials
    shard_id: int
    skip_files: _containers.RepeatedCompositeFieldContainer[_raft_pb2.SnapshotFile]
    token: str
    def __init__(self, shard_id: _Optional[int] = ..., location: _Optional[str] = ..., backup_id: _Optional[str] = ..., token: _Optional[str] = ..., skip_files: _Optional[_Iterable[_Union[_raft_pb2.SnapshotFile, _Mapping]]] = ..., s3_credentials: _Optional[_Union[S3Credentials, _Mapping]] = ...) -> None: ...

class BackupShardToResponse(_message.Message):
    __slots__ = ["bytes_written", "header", "written"]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    bytes_written: int
    header: _raft_pb2.SnapshotHeader
    written: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[_raft_pb2.SnapshotHeader, _Mapping]] = ..., written: _Optional[_Iterable[int]] = ..., bytes_written: _Optional[int] = ...) -> None: ...

class ChangeReplicasRequest(_message.Message):
    __slots__ = ["changes", "epoch", "shard_id"]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[ReplicaChange]
    epoch: int
    shard_id: int
    def __init__(self, shard_id: _Optional[int] = ..., epoch: _Optional[int] = ..., changes: _Optional[_Iterable[_Union[ReplicaChange, _Mapping]]] = ...) -> None: ...

class ChangeReplicasResponse(_message.Message):
    __slots__ = ["descriptor"]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    descriptor: _meta_pb2.ShardDescriptor
    def __init__(self, descriptor: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ["cluster_id", "nodes", "shards"]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    def __init__(self, cluster_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ...) -> None: ...

class DecommissionNodeRequest(_message.Message):
    __slots__ = ["node_id"]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class DecommissionNodeResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class DrainLeadersRequest(_message.Message):
    __slots__ = ["node_id"]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class DrainLeadersResponse(_message.Message):
    __slots__ = ["node_id", "remaining_shard_ids", "transferred"]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REMAINING_SHARD_IDS_FIELD_NUMBER: _ClassVar[int]
    TRANSFERRED_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    remaining_shard_ids: _containers.RepeatedScalarFieldContainer[int]
    transferred: int
    def __init__(self, node_id: _Optional[int] = ..., transferred: _Optional[int] = ..., remaining_shard_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetAuthStateRequest(_message.Message):
    __slots__ = ["known_revision"]
    KNOWN_REVISION_FIELD_NUMBER: _ClassVar[int]
    known_revision: int
    def __init__(self, known_revision: _Optional[int] = ...) -> None: ...

class GetAuthStateResponse(_message.Message):
    __slots__ = ["revision", "state"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    revision: int
    state: _auth_pb2.AuthState
    def __init__(self, state: _Optional[_Union[_auth_pb2.AuthState, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class GetRoutingRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetRoutingResponse(_message.Message):
    __slots__ = ["cluster_id", "nodes", "shards"]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[_meta_pb2.NodeDescriptor]
    shards: _containers.RepeatedCompositeFieldContainer[_meta_pb2.RoutedShard]
    def __init__(self, cluster_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[_meta_pb2.NodeDescriptor, _Mapping]]] = ..., shards: _Optional[_Iterable[_Union[_meta_pb2.RoutedShard, _Mapping]]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ["led", "stats"]
    LED_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    led: _containers.RepeatedCompositeFieldContainer[LedShard]
    stats: NodeStats
    def __init__(self, stats: _Optional[_Union[NodeStats, _Mapping]] = ..., led: _Optional[_Iterable[_Union[LedShard, _Mapping]]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ["draining_leader_nodes"]
    DRAINING_LEADER_NODES_FIELD_NUMBER: _ClassVar[int]
    draining_leader_nodes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, draining_leader_nodes: _Optional[_Iterable[int]] = ...) -> None: ...

class LedShard(_message.Message):
    __slots__ = ["caught_up_learners", "epoch", "shard_id", "size_bytes"]
    CAUGHT_UP_LEARNERS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    caught_up_learners: _containers.RepeatedScalarFieldContainer[int]
    epoch: int
    shard_id: int
    size_bytes: int
    def __init__(self, shard_id: _Optional[int] = ..., epoch: _Optional[int] = ..., size_bytes: _Optional[int] = ..., caught_up_learners: _Optional[_Iterable[int]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ["nodes"]
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ...) -> None: ...

class ListShardsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListShardsResponse(_message.Message):
    __slots__ = ["shards"]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    def __init__(self, shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ...) -> None: ...

class MergeShardsRequest(_message.Message):
    __slots__ = ["key", "shard_id"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    shard_id: int
    def __init__(self, key: _Optional[bytes] = ..., shard_id: _Optional[int] = ...) -> None: ...

class MergeShardsResponse(_message.Message):
    __slots__ = ["merged", "removed_shard_id"]
    MERGED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    merged: _meta_pb2.ShardDescriptor
    removed_shard_id: int
    def __init__(self, merged: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ..., removed_shard_id: _Optional[int] = ...) -> None: ...

class MoveReplicaRequest(_message.Message):
    __slots__ = ["from_node_id", "pin_seconds", "shard_id", "to_node_id"]
    FROM_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    from_node_id: int
    pin_seconds: int
    shard_id: int
    to_node_id: int
    def __init__(self, shard_id: _Optional[int] = ..., from_node_id: _Optional[int] = ..., to_node_id: _Optional[int] = ..., pin_seconds: _Optional[int] = ...) -> None: ...

class MoveReplicaResponse(_message.Message):
    __slots__ = ["operation"]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: PlacementOperation
    def __init__(self, operation: _Optional[_Union[PlacementOperation, _Mapping]] = ...) -> None: ...

class NodeInfoRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class NodeInfoResponse(_message.Message):
    __slots__ = ["node", "shards", "used_bytes"]
    NODE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    node: _meta_pb2.NodeDescriptor
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    used_bytes: int
    def __init__(self, node: _Optional[_Union[_meta_pb2.NodeDescriptor, _Mapping]] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., used_bytes: _Optional[int] = ...) -> None: ...

class NodePlacement(_message.Message):
    __slots__ = ["bytes", "last_heartbeat_unix_nanos", "leaders", "node", "replicas", "state", "stats", "stuck"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    LEADERS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    STUCK_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    last_heartbeat_unix_nanos: int
    leaders: int
    node: _meta_pb2.NodeDescriptor
    replicas: int
    state: str
    stats: NodeStats
    stuck: _containers.RepeatedCompositeFieldContainer[StuckReplica]
    def __init__(self, node: _Optional[_Union[_meta_pb2.NodeDescriptor, _Mapping]] = ..., state: _Optional[str] = ..., last_heartbeat_unix_nanos: _Optional[int] = ..., stats: _Optional[_Union[NodeStats, _Mapping]] = ..., replicas: _Optional[int] = ..., leaders: _Optional[int] = ..., bytes: _Optional[int] = ..., stuck: _Optional[_Iterable[_Union[StuckReplica, _Mapping]]] = ...) -> None: ...

class NodeStats(_message.Message):
    __slots__ = ["applying_backlog", "available_bytes", "capacity_bytes", "draining_leaders", "leader_count", "node", "replica_count", "requests_per_second", "used_bytes", "write_bytes_per_second"]
    APPLYING_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAINING_LEADERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_COUNT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COUNT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITE_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    applying_backlog: bool
    available_bytes: int
    capacity_bytes: int
    draining_leaders: bool
    leader_count: int
    node: _meta_pb2.NodeDescriptor
    replica_count: int
    requests_per_second: float
    used_bytes: int
    write_bytes_per_second: float
    def __init__(self, node: _Optional[_Union[_meta_pb2.NodeDescriptor, _Mapping]] = ..., capacity_bytes: _Optional[int] = ..., available_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., replica_count: _Optional[int] = ..., leader_count: _Optional[int] = ..., requests_per_second: _Optional[float] = ..., write_bytes_per_second: _Optional[float] = ..., draining_leaders: bool = ..., applying_backlog: bool = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ["last_seen_unix_nanos", "leader_count", "live", "node", "removed", "replica_count", "used_bytes"]
    LAST_SEEN_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    LEADER_COUNT_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COUNT_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    last_seen_unix_nanos: int
    leader_count: int
    live: bool
    node: _meta_pb2.NodeDescriptor
    removed: bool
    replica_count: int
    used_bytes: int
    def __init__(self, node: _Optional[_Union[_meta_pb2.NodeDescriptor, _Mapping]] = ..., live: bool = ..., last_seen_unix_nanos: _Optional[int] = ..., replica_count: _Optional[int] = ..., leader_count: _Optional[int] = ..., used_bytes: _Optional[int] = ..., removed: bool = ...) -> None: ...

class PlacementHistoryRequest(_message.Message):
    __slots__ = ["limit"]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class PlacementHistoryResponse(_message.Message):
    __slots__ = ["operations"]
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    operations: _containers.RepeatedCompositeFieldContainer[PlacementOperation]
    def __init__(self, operations: _Optional[_Iterable[_Union[PlacementOperation, _Mapping]]] = ...) -> None: ...

class PlacementOperation(_message.Message):
    __slots__ = ["error", "finished_unix_nanos", "from_node_id", "kind", "node_id", "reason", "shard_id", "started_unix_nanos", "state"]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    error: str
    finished_unix_nanos: int
    from_node_id: int
    kind: str
    node_id: int
    reason: str
    shard_id: int
    started_unix_nanos: int
    state: str
    def __init__(self, shard_id: _Optional[int] = ..., kind: _Optional[str] = ..., node_id: _Optional[int] = ..., from_node_id: _Optional[int] = ..., reason: _Optional[str] = ..., started_unix_nanos: _Optional[int] = ..., finished_unix_nanos: _Optional[int] = ..., state: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class PlacementStatusRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class PlacementStatusResponse(_message.Message):
    __slots__ = ["balanced", "bytes_spread_percent", "leader_spread", "nodes", "placement_leader_node_id", "replica_spread", "running", "stuck"]
    BALANCED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SPREAD_PERCENT_FIELD_NUMBER: _ClassVar[int]
    LEADER_SPREAD_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_SPREAD_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    STUCK_FIELD_NUMBER: _ClassVar[int]
    balanced: bool
    bytes_spread_percent: float
    leader_spread: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodePlacement]
    placement_leader_node_id: int
    replica_spread: int
    running: _containers.RepeatedCompositeFieldContainer[PlacementOperation]
    stuck: _containers.RepeatedCompositeFieldContainer[StuckReplica]
    def __init__(self, placement_leader_node_id: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodePlacement, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[PlacementOperation, _Mapping]]] = ..., stuck: _Optional[_Iterable[_Union[StuckReplica, _Mapping]]] = ..., replica_spread: _Optional[int] = ..., leader_spread: _Optional[int] = ..., bytes_spread_percent: _Optional[float] = ..., balanced: bool = ...) -> None: ...

class RecommissionNodeRequest(_message.Message):
    __slots__ = ["node_id"]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class RecommissionNodeResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class RemoveNodeRequest(_message.Message):
    __slots__ = ["node_id"]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class RemoveNodeResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ReplicaChange(_message.Message):
    __slots__ = ["node_id", "replica_id", "type"]
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_ADD_LEARNER: ReplicaChange.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TYPE_PROMOTE_LEARNER: ReplicaChange.Type
    TYPE_REMOVE_REPLICA: ReplicaChange.Type
    TYPE_UNSPECIFIED: ReplicaChange.Type
    node_id: int
    replica_id: int
    type: ReplicaChange.Type
    def __init__(self, type: _Optional[_Union[ReplicaChange.Type, str]] = ..., node_id: _Optional[int] = ..., replica_id: _Optional[int] = ...) -> None: ...

class ReplicaChecksumRequest(_message.Message):
    __slots__ = ["shard_id"]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    shard_id: int
    def __init__(self, shard_id: _Optional[int] = ...) -> None: ...

class ReplicaChecksumResponse(_message.Message):
    __slots__ = ["applied_index", "checksum", "node_id", "shard_id"]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    applied_index: int
    checksum: int
    node_id: int
    shard_id: int
    def __init__(self, node_id: _Optional[int] = ..., shard_id: _Optional[int] = ..., applied_index: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ["leader", "match_index", "node_id", "replica_id", "role"]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    leader: bool
    match_index: int
    node_id: int
    replica_id: int
    role: _meta_pb2.ReplicaRole
    def __init__(self, node_id: _Optional[int] = ..., replica_id: _Optional[int] = ..., role: _Optional[_Union[_meta_pb2.ReplicaRole, str]] = ..., match_index: _Optional[int] = ..., leader: bool = ...) -> None: ...

class ReportShardsRequest(_message.Message):
    __slots__ = ["descriptors", "removed_shard_ids"]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_SHARD_IDS_FIELD_NUMBER: _ClassVar[int]
    descriptors: _containers.RepeatedCompositeFieldContainer[_meta_pb2.ShardDescriptor]
    removed_shard_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, descriptors: _Optional[_Iterable[_Union[_meta_pb2.ShardDescriptor, _Mapping]]] = ..., removed_shard_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReportShardsResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class S3Credentials(_message.Message):
    __slots__ = ["access_key_id", "secret_access_key", "session_token"]
    ACCESS_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_ACCESS_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    access_key_id: str
    secret_access_key: str
    session_token: str
    def __init__(self, access_key_id: _Optional[str] = ..., secret_access_key: _Optional[str] = ..., session_token: _Optional[str] = ...) -> None: ...

class ShardDirectoryRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ShardDirectoryResponse(_message.Message):
    __slots__ = ["shards"]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[_meta_pb2.ShardDescriptor]
    def __init__(self, shards: _Optional[_Iterable[_Union[_meta_pb2.ShardDescriptor, _Mapping]]] = ...) -> None: ...

class ShardInfoRequest(_message.Message):
    __slots__ = ["shard_id"]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    shard_id: int
    def __init__(self, shard_id: _Optional[int] = ...) -> None: ...

class ShardInfoResponse(_message.Message):
    __slots__ = ["shard"]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    shard: ShardStatus
    def __init__(self, shard: _Optional[_Union[ShardStatus, _Mapping]] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ["applied_index", "commit_index", "descriptor", "leader_node_id", "led_load_ticks", "peak_requests_per_second", "quiesced", "replicas", "reported_by", "requests_per_second", "revision", "size_bytes", "stopped", "term"]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LED_LOAD_TICKS_FIELD_NUMBER: _ClassVar[int]
    PEAK_REQUESTS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    QUIESCED_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REPORTED_BY_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    applied_index: int
    commit_index: int
    descriptor: _meta_pb2.ShardDescriptor
    leader_node_id: int
    led_load_ticks: int
    peak_requests_per_second: float
    quiesced: bool
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    reported_by: int
    requests_per_second: float
    revision: int
    size_bytes: int
    stopped: str
    term: int
    def __init__(self, descriptor: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ..., leader_node_id: _Optional[int] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., revision: _Optional[int] = ..., size_bytes: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., reported_by: _Optional[int] = ..., quiesced: bool = ..., stopped: _Optional[str] = ..., requests_per_second: _Optional[float] = ..., led_load_ticks: _Optional[int] = ..., peak_requests_per_second: _Optional[float] = ...) -> None: ...

class SplitShardRequest(_message.Message):
    __slots__ = ["automatic", "right_leader_node_id", "right_shard_id", "shard_id", "split_key"]
    AUTOMATIC_FIELD_NUMBER: _ClassVar[int]
    RIGHT_LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RIGHT_SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_KEY_FIELD_NUMBER: _ClassVar[int]
    automatic: bool
    right_leader_node_id: int
    right_shard_id: int
    shard_id: int
    split_key: bytes
    def __init__(self, split_key: _Optional[bytes] = ..., shard_id: _Optional[int] = ..., right_shard_id: _Optional[int] = ..., automatic: bool = ..., right_leader_node_id: _Optional[int] = ...) -> None: ...

class SplitShardResponse(_message.Message):
    __slots__ = ["left", "right"]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    RIGHT_FIELD_NUMBER: _ClassVar[int]
    left: _meta_pb2.ShardDescriptor
    right: _meta_pb2.ShardDescriptor
    def __init__(self, left: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ..., right: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ...) -> None: ...

class StuckReplica(_message.Message):
    __slots__ = ["node_id", "reason", "shard_id"]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    reason: str
    shard_id: int
    def __init__(self, shard_id: _Optional[int] = ..., node_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class TransferLeaderRequest(_message.Message):
    __slots__ = ["pin_seconds", "scheduled", "shard_id", "target_node_id"]
    PIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    pin_seconds: int
    scheduled: bool
    shard_id: int
    target_node_id: int
    def __init__(self, shard_id: _Optional[int] = ..., target_node_id: _Optional[int] = ..., pin_seconds: _Optional[int] = ..., scheduled: bool = ...) -> None: ...

class TransferLeaderResponse(_message.Message):
    __slots__ = ["leader_node_id"]
    LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    leader_node_id: int
    def __init__(self, leader_node_id: _Optional[int] = ...) -> None: ...
