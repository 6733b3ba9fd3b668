from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
PERMISSION_TYPE_READ: PermissionType
PERMISSION_TYPE_READWRITE: PermissionType
PERMISSION_TYPE_UNSPECIFIED: PermissionType
PERMISSION_TYPE_WRITE: PermissionType

class AuthDisableRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class AuthDisableResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class AuthEnableRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class AuthEnableResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class AuthRotateKeyRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class AuthRotateKeyResponse(_message.Message):
    __slots__ = ["key_id", "revision"]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    revision: int
    def __init__(self, revision: _Optional[int] = ..., key_id: _Optional[str] = ...) -> None: ...

class AuthState(_message.Message):
    __slots__ = ["enabled", "revision", "roles", "signing_keys", "users"]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    SIGNING_KEYS_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    revision: int
    roles: _containers.RepeatedCompositeFieldContainer[Role]
    signing_keys: _containers.RepeatedCompositeFieldContainer[SigningKey]
    users: _containers.RepeatedCompositeFieldContainer[User]
    def __init__(self, enabled: bool = ..., revision: _Optional[int] = ..., users: _Optional[_Iterable[_Union[User, _Mapping]]] = ..., roles: _Optional[_Iterable[_Union[Role, _Mapping]]] = ..., signing_keys: _Optional[_Iterable[_Union[SigningKey, _Mapping]]] = ...) -> None: ...

class AuthStatusRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class AuthStatusResponse(_message.Message):
    __slots__ = ["enabled", "revision", "roles", "user"]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    revision: int
    roles: _containers.RepeatedScalarFieldContainer[str]
    user: str
    def __init__(self, enabled: bool = ..., revision: _Optional[int] = ..., user: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ...) -> None: ...

class AuthenticateRequest(_message.Message):
    __slots__ = ["name", "password"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    name: str
    password: str
    def __init__(self, name: _Optional[str] = ..., password: _Optional[str] = ...) -> None: ...

class AuthenticateResponse(_message.Message):
    __slots__ = ["expires_unix_ms", "token"]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    expires_unix_ms: int
    token: str
    def __init__(self, token: _Optional[str] = ..., expires_unix_ms: _Optional[int] = ...) -> None: ...

class Permission(_message.Message):
    __slots__ = ["key", "prefix", "range_end", "type"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    RANGE_END_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    prefix: bool
    range_end: bytes
    type: PermissionType
    def __init__(self, type: _Optional[_Union[PermissionType, str]] = ..., key: _Optional[bytes] = ..., range_end: _Optional[bytes] = ..., prefix: bool = ...) -> None: ...

class Role(_message.Message):
    __slots__ = ["name", "permissions"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    permissions: _containers.RepeatedCompositeFieldContainer[Permission]
    def __init__(self, name: _Optional[str] = ..., permissions: _Optional[_Iterable[_Union[Permission, _Mapping]]] = ...) -> None: ...

class RoleAddRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RoleAddResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class RoleDeleteRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RoleDeleteResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class RoleGetRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RoleGetResponse(_message.Message):
    __slots__ = ["role"]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: Role
    def __init__(self, role: _Optional[_Union[Role, _Mapping]] = ...) -> None: ...

class RoleGrantPermissionRequest(_message.Message):
    __slots__ = ["permission", "role"]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    permission: Permission
    role: str
    def __init__(self, role: _Optional[str] = ..., permission: _Optional[_Union[Permission, _Mapping]] = ...) -> None: ...

class RoleGrantPermissionResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class RoleListRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class RoleListResponse(_message.Message):
    __slots__ = ["roles"]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    roles: _containers.RepeatedCompositeFieldContainer[Role]
    def __init__(self, roles: _Optional[_Iterable[_Union[Role, _Mapping]]] = ...) -> None: ...

class RoleRevokePermissionRequest(_message.Message):
    __slots__ = ["permission", "role"]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    permission: Permission
    role: str
    def __init__(self, role: _Optional[str] = ..., permission: _Optional[_Union[Permission, _Mapping]] = ...) -> None: ...

class RoleRevokePermissionResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class SigningKey(_message.Message):
    __slots__ = ["created_unix_nanos", "ed25519_seed", "id"]
    CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    ED25519_SEED_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    created_unix_nanos: int
    ed25519_seed: bytes
    id: str
    def __init__(self, id: _Optional[str] = ..., ed25519_seed: _Optional[bytes] = ..., created_unix_nanos: _Optional[int] = ...) -> None: ...

class User(_message.Message):
    __slots__ = ["name", "password_hash", "roles", "token_generation"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_HASH_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    password_hash: bytes
    roles: _containers.RepeatedScalarFieldContainer[str]
    token_generation: int
    def __init__(self, name: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., password_hash: _Optional[bytes] = ..., token_generation: _Optional[int] = ...) -> None: ...

class UserAddRequest(_message.Message):
    __slots__ = ["name", "no_password", "password"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NO_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    name: str
    no_password: bool
    password: str
    def __init__(self, name: _Optional[str] = ..., password: _Optional[str] = ..., no_password: bool = ...) -> None: ...

class UserAddResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class UserChangePasswordRequest(_message.Message):
    __slots__ = ["name", "password"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    name: str
    password: str
    def __init__(self, name: _Optional[str] = ..., password: _Optional[str] = ...) -> None: ...

class UserChangePasswordResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class UserDeleteRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UserDeleteResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class UserGetRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UserGetResponse(_message.Message):
    __slots__ = ["user"]
    USER_FIELD_NUMBER: _ClassVar[int]
    user: UserInfo
    def __init__(self, user: _Optional[_Union[UserInfo, _Mapping]] = ...) -> None: ...

class UserGrantRoleRequest(_message.Message):
    __slots__ = ["role", "user"]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    role: str
    user: str
    def __init__(self, user: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class UserGrantRoleResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class UserInfo(_message.Message):
    __slots__ = ["has_password", "name", "roles"]
    HAS_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    has_password: bool
    name: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., has_password: bool = ...) -> None: ...

class UserListRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class UserListResponse(_message.Message):
    __slots__ = ["users"]
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[UserInfo]
    def __init__(self, users: _Optional[_Iterable[_Union[UserInfo, _Mapping]]] = ...) -> None: ...

class UserRevokeRoleRequest(_message.Message):
    __slots__ = ["role", "user"]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    role: str
    user: str
    def __init__(self, user: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class UserRevokeRoleResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class PermissionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
