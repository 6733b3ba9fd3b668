from google.protobuf import any_pb2 as _any_pb2
from shale.v1 import meta_pb2 as _meta_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
READ_CONSISTENCY_FOLLOWER: ReadConsistency
READ_CONSISTENCY_LINEARIZABLE_UNSPECIFIED: ReadConsistency
READ_CONSISTENCY_STALE: ReadConsistency

class BatchRequest(_message.Message):
    __slots__ = ["header", "ops"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    ops: _containers.RepeatedCompositeFieldContainer[RequestOp]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., ops: _Optional[_Iterable[_Union[RequestOp, _Mapping]]] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ["header", "results"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    results: _containers.RepeatedCompositeFieldContainer[ResponseOp]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[ResponseOp, _Mapping]]] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ["id", "method", "request", "timeout_ms", "trace_context"]
    class TraceContextEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    id: int
    method: str
    request: bytes
    timeout_ms: int
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[int] = ..., method: _Optional[str] = ..., request: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CallBatch(_message.Message):
    __slots__ = ["calls"]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[Call]
    def __init__(self, calls: _Optional[_Iterable[_Union[Call, _Mapping]]] = ...) -> None: ...

class CallResult(_message.Message):
    __slots__ = ["code", "details", "id", "message", "response"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    code: int
    details: _containers.RepeatedCompositeFieldContainer[_any_pb2.Any]
    id: int
    message: str
    response: bytes
    def __init__(self, id: _Optional[int] = ..., response: _Optional[bytes] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., details: _Optional[_Iterable[_Union[_any_pb2.Any, _Mapping]]] = ...) -> None: ...

class Compare(_message.Message):
    __slots__ = ["key", "number", "result", "target", "value"]
    class Result(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    class Target(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    KEY_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    RESULT_EQUAL_UNSPECIFIED: Compare.Result
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RESULT_GREATER: Compare.Result
    RESULT_LESS: Compare.Result
    RESULT_NOT_EQUAL: Compare.Result
    TARGET_CREATE_REVISION: Compare.Target
    TARGET_EXISTS: Compare.Target
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TARGET_MOD_REVISION: Compare.Target
    TARGET_VALUE_UNSPECIFIED: Compare.Target
    TARGET_VERSION: Compare.Target
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    number: int
    result: Compare.Result
    target: Compare.Target
    value: bytes
    def __init__(self, key: _Optional[bytes] = ..., target: _Optional[_Union[Compare.Target, str]] = ..., result: _Optional[_Union[Compare.Result, str]] = ..., value: _Optional[bytes] = ..., number: _Optional[int] = ...) -> None: ...

class CompareAndSwapRequest(_message.Message):
    __slots__ = ["expect_absent", "expected_value", "header", "key", "new_value", "ttl_ms"]
    EXPECTED_VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPECT_ABSENT_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    NEW_VALUE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    expect_absent: bool
    expected_value: bytes
    header: RequestHeader
    key: bytes
    new_value: bytes
    ttl_ms: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., key: _Optional[bytes] = ..., expected_value: _Optional[bytes] = ..., expect_absent: bool = ..., new_value: _Optional[bytes] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class CompareAndSwapResponse(_message.Message):
    __slots__ = ["current", "header", "succeeded"]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    current: KeyValue
    header: ResponseHeader
    succeeded: bool
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., succeeded: bool = ..., current: _Optional[_Union[KeyValue, _Mapping]] = ...) -> None: ...

class DeleteOp(_message.Message):
    __slots__ = ["key", "prev_kv"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    prev_kv: bool
    def __init__(self, key: _Optional[bytes] = ..., prev_kv: bool = ...) -> None: ...

class DeleteRangeOp(_message.Message):
    __slots__ = ["end_key", "start_key"]
    END_KEY_FIELD_NUMBER: _ClassVar[int]
    START_KEY_FIELD_NUMBER: _ClassVar[int]
    end_key: bytes
    start_key: bytes
    def __init__(self, start_key: _Optional[bytes] = ..., end_key: _Optional[bytes] = ...) -> None: ...

class DeleteRangeRequest(_message.Message):
    __slots__ = ["end_key", "header", "start_key"]
    END_KEY_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    START_KEY_FIELD_NUMBER: _ClassVar[int]
    end_key: bytes
    header: RequestHeader
    start_key: bytes
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., start_key: _Optional[bytes] = ..., end_key: _Optional[bytes] = ...) -> None: ...

class DeleteRangeResponse(_message.Message):
    __slots__ = ["header"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ["header", "key", "prev_kv"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    key: bytes
    prev_kv: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., key: _Optional[bytes] = ..., prev_kv: bool = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ["deleted", "header", "prev_kv"]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    header: ResponseHeader
    prev_kv: KeyValue
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., deleted: _Optional[int] = ..., prev_kv: _Optional[_Union[KeyValue, _Mapping]] = ...) -> None: ...

class GetOp(_message.Message):
    __slots__ = ["key"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    def __init__(self, key: _Optional[bytes] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ["header", "key"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    key: bytes
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., key: _Optional[bytes] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ["header", "kv"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    kv: KeyValue
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., kv: _Optional[_Union[KeyValue, _Mapping]] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ["create_revision", "expire_unix_nanos", "key", "mod_revision", "value", "version"]
    CREATE_REVISION_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MOD_REVISION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    create_revision: int
    expire_unix_nanos: int
    key: bytes
    mod_revision: int
    value: bytes
    version: int
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., create_revision: _Optional[int] = ..., mod_revision: _Optional[int] = ..., version: _Optional[int] = ..., expire_unix_nanos: _Optional[int] = ...) -> None: ...

class MultiGetRequest(_message.Message):
    __slots__ = ["header", "keys"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class MultiGetResponse(_message.Message):
    __slots__ = ["header", "results"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    results: _containers.RepeatedCompositeFieldContainer[MultiGetResult]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[MultiGetResult, _Mapping]]] = ...) -> None: ...

class MultiGetResult(_message.Message):
    __slots__ = ["key", "kv"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    kv: KeyValue
    def __init__(self, key: _Optional[bytes] = ..., kv: _Optional[_Union[KeyValue, _Mapping]] = ...) -> None: ...

class PutOp(_message.Message):
    __slots__ = ["key", "prev_kv", "ttl_ms", "value"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    prev_kv: bool
    ttl_ms: int
    value: bytes
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., ttl_ms: _Optional[int] = ..., prev_kv: bool = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ["header", "key", "prev_kv", "ttl_ms", "value"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    key: bytes
    prev_kv: bool
    ttl_ms: int
    value: bytes
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., ttl_ms: _Optional[int] = ..., prev_kv: bool = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ["header", "prev_kv"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    prev_kv: KeyValue
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., prev_kv: _Optional[_Union[KeyValue, _Mapping]] = ...) -> None: ...

class RequestHeader(_message.Message):
    __slots__ = ["consistency", "epoch", "first_attempt", "request_id", "shard_id"]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    consistency: ReadConsistency
    epoch: int
    first_attempt: bool
    request_id: bytes
    shard_id: int
    def __init__(self, shard_id: _Optional[int] = ..., epoch: _Optional[int] = ..., request_id: _Optional[bytes] = ..., consistency: _Optional[_Union[ReadConsistency, str]] = ..., first_attempt: bool = ...) -> None: ...

class RequestOp(_message.Message):
    __slots__ = ["delete", "delete_range", "get", "put"]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    DELETE_RANGE_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    delete: DeleteOp
    delete_range: DeleteRangeOp
    get: GetOp
    put: PutOp
    def __init__(self, put: _Optional[_Union[PutOp, _Mapping]] = ..., delete: _Optional[_Union[DeleteOp, _Mapping]] = ..., delete_range: _Optional[_Union[DeleteRangeOp, _Mapping]] = ..., get: _Optional[_Union[GetOp, _Mapping]] = ...) -> None: ...

class ResponseHeader(_message.Message):
    __slots__ = ["epoch", "node_id", "revision", "shard_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    node_id: int
    revision: int
    shard_id: int
    def __init__(self, shard_id: _Optional[int] = ..., revision: _Optional[int] = ..., node_id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class ResponseOp(_message.Message):
    __slots__ = ["delete", "delete_range", "get", "put"]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    DELETE_RANGE_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    delete: DeleteResponse
    delete_range: DeleteRangeResponse
    get: GetResponse
    put: PutResponse
    def __init__(self, put: _Optional[_Union[PutResponse, _Mapping]] = ..., delete: _Optional[_Union[DeleteResponse, _Mapping]] = ..., delete_range: _Optional[_Union[DeleteRangeResponse, _Mapping]] = ..., get: _Optional[_Union[GetResponse, _Mapping]] = ...) -> None: ...

class ResultBatch(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CallResult]
    def __init__(self, results: _Optional[_Iterable[_Union[CallResult, _Mapping]]] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ["continuation_token", "end_key", "header", "keys_only", "limit", "prefix", "reverse", "start_key"]
    CONTINUATION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    END_KEY_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEYS_ONLY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    REVERSE_FIELD_NUMBER: _ClassVar[int]
    START_KEY_FIELD_NUMBER: _ClassVar[int]
    continuation_token: bytes
    end_key: bytes
    header: RequestHeader
    keys_only: bool
    limit: int
    prefix: bytes
    reverse: bool
    start_key: bytes
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., start_key: _Optional[bytes] = ..., end_key: _Optional[bytes] = ..., prefix: _Optional[bytes] = ..., reverse: bool = ..., limit: _Optional[int] = ..., continuation_token: _Optional[bytes] = ..., keys_only: bool = ...) -> None: ...

class ScanResponse(_message.Message):
    __slots__ = ["continuation_token", "header", "kvs", "resume_key"]
    CONTINUATION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KVS_FIELD_NUMBER: _ClassVar[int]
    RESUME_KEY_FIELD_NUMBER: _ClassVar[int]
    continuation_token: bytes
    header: ResponseHeader
    kvs: _containers.RepeatedCompositeFieldContainer[KeyValue]
    resume_key: bytes
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., kvs: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ..., continuation_token: _Optional[bytes] = ..., resume_key: _Optional[bytes] = ...) -> None: ...

class ScanToken(_message.Message):
    __slots__ = ["checksum", "remaining", "resume_key"]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    RESUME_KEY_FIELD_NUMBER: _ClassVar[int]
    checksum: int
    remaining: int
    resume_key: bytes
    def __init__(self, resume_key: _Optional[bytes] = ..., remaining: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...

class TxnRequest(_message.Message):
    __slots__ = ["compares", "failure", "header", "success"]
    COMPARES_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    compares: _containers.RepeatedCompositeFieldContainer[Compare]
    failure: _containers.RepeatedCompositeFieldContainer[RequestOp]
    header: RequestHeader
    success: _containers.RepeatedCompositeFieldContainer[RequestOp]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., compares: _Optional[_Iterable[_Union[Compare, _Mapping]]] = ..., success: _Optional[_Iterable[_Union[RequestOp, _Mapping]]] = ..., failure: _Optional[_Iterable[_Union[RequestOp, _Mapping]]] = ...) -> None: ...

class TxnResponse(_message.Message):
    __slots__ = ["header", "results", "succeeded"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    results: _containers.RepeatedCompositeFieldContainer[ResponseOp]
    succeeded: bool
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., succeeded: bool = ..., results: _Optional[_Iterable[_Union[ResponseOp, _Mapping]]] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ["kv", "prev_kv", "type"]
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    KV_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    TYPE_DELETE: WatchEvent.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TYPE_PUT_UNSPECIFIED: WatchEvent.Type
    kv: KeyValue
    prev_kv: KeyValue
    type: WatchEvent.Type
    def __init__(self, type: _Optional[_Union[WatchEvent.Type, str]] = ..., kv: _Optional[_Union[KeyValue, _Mapping]] = ..., prev_kv: _Optional[_Union[KeyValue, _Mapping]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ["end_key", "header", "prefix", "prev_kv", "progress_notify", "range_epoch", "revision_shard_id", "start_key", "start_revision"]
    END_KEY_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_NOTIFY_FIELD_NUMBER: _ClassVar[int]
    RANGE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REVISION_SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    START_KEY_FIELD_NUMBER: _ClassVar[int]
    START_REVISION_FIELD_NUMBER: _ClassVar[int]
    end_key: bytes
    header: RequestHeader
    prefix: bytes
    prev_kv: bool
    progress_notify: bool
    range_epoch: int
    revision_shard_id: int
    start_key: bytes
    start_revision: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., start_key: _Optional[bytes] = ..., end_key: _Optional[bytes] = ..., prefix: _Optional[bytes] = ..., start_revision: _Optional[int] = ..., prev_kv: bool = ..., progress_notify: bool = ..., range_epoch: _Optional[int] = ..., revision_shard_id: _Optional[int] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ["events", "header", "range_change"]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RANGE_CHANGE_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[WatchEvent]
    header: ResponseHeader
    range_change: _meta_pb2.ShardDescriptor
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., events: _Optional[_Iterable[_Union[WatchEvent, _Mapping]]] = ..., range_change: _Optional[_Union[_meta_pb2.ShardDescriptor, _Mapping]] = ...) -> None: ...

class ReadConsistency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
