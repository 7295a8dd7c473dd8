from . import errorpb_pb2 as _errorpb_pb2
from . import metapb_pb2 as _metapb_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExtraOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Noop: _ClassVar[ExtraOp]
    ReadOldValue: _ClassVar[ExtraOp]

class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Put: _ClassVar[Op]
    Del: _ClassVar[Op]
    Lock: _ClassVar[Op]
    Rollback: _ClassVar[Op]
    Insert: _ClassVar[Op]

class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NoAction: _ClassVar[Action]
    TTLExpireRollback: _ClassVar[Action]
    LockNotExistRollback: _ClassVar[Action]
    MinCommitTSPushed: _ClassVar[Action]
Noop: ExtraOp
ReadOldValue: ExtraOp
Put: Op
Del: Op
Lock: Op
Rollback: Op
Insert: Op
NoAction: Action
TTLExpireRollback: Action
LockNotExistRollback: Action
MinCommitTSPushed: Action

class Context(_message.Message):
    __slots__ = ("region_id", "region_epoch", "peer", "term")
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    region_id: int
    region_epoch: _metapb_pb2.RegionEpoch
    peer: _metapb_pb2.Peer
    term: int
    def __init__(self, region_id: _Optional[int] = ..., region_epoch: _Optional[_Union[_metapb_pb2.RegionEpoch, _Mapping]] = ..., peer: _Optional[_Union[_metapb_pb2.Peer, _Mapping]] = ..., term: _Optional[int] = ...) -> None: ...

class LockInfo(_message.Message):
    __slots__ = ("primary_lock", "lock_version", "key", "lock_ttl", "txn_size", "lock_type")
    PRIMARY_LOCK_FIELD_NUMBER: _ClassVar[int]
    LOCK_VERSION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LOCK_TTL_FIELD_NUMBER: _ClassVar[int]
    TXN_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCK_TYPE_FIELD_NUMBER: _ClassVar[int]
    primary_lock: bytes
    lock_version: int
    key: bytes
    lock_ttl: int
    txn_size: int
    lock_type: Op
    def __init__(self, primary_lock: _Optional[bytes] = ..., lock_version: _Optional[int] = ..., key: _Optional[bytes] = ..., lock_ttl: _Optional[int] = ..., txn_size: _Optional[int] = ..., lock_type: _Optional[_Union[Op, str]] = ...) -> None: ...

class KeyError(_message.Message):
    __slots__ = ("locked", "retryable", "abort")
    LOCKED_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    locked: LockInfo
    retryable: str
    abort: str
    def __init__(self, locked: _Optional[_Union[LockInfo, _Mapping]] = ..., retryable: _Optional[str] = ..., abort: _Optional[str] = ...) -> None: ...

class KvPair(_message.Message):
    __slots__ = ("error", "key", "value")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    error: KeyError
    key: bytes
    value: bytes
    def __init__(self, error: _Optional[_Union[KeyError, _Mapping]] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("context", "start_key", "limit", "version", "key_only", "reverse", "end_key", "sample_step")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    START_KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KEY_ONLY_FIELD_NUMBER: _ClassVar[int]
    REVERSE_FIELD_NUMBER: _ClassVar[int]
    END_KEY_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_STEP_FIELD_NUMBER: _ClassVar[int]
    context: Context
    start_key: bytes
    limit: int
    version: int
    key_only: bool
    reverse: bool
    end_key: bytes
    sample_step: int
    def __init__(self, context: _Optional[_Union[Context, _Mapping]] = ..., start_key: _Optional[bytes] = ..., limit: _Optional[int] = ..., version: _Optional[int] = ..., key_only: _Optional[bool] = ..., reverse: _Optional[bool] = ..., end_key: _Optional[bytes] = ..., sample_step: _Optional[int] = ...) -> None: ...

class ScanResponse(_message.Message):
    __slots__ = ("region_error", "pairs", "error")
    REGION_ERROR_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    region_error: _errorpb_pb2.Error
    pairs: _containers.RepeatedCompositeFieldContainer[KvPair]
    error: KeyError
    def __init__(self, region_error: _Optional[_Union[_errorpb_pb2.Error, _Mapping]] = ..., pairs: _Optional[_Iterable[_Union[KvPair, _Mapping]]] = ..., error: _Optional[_Union[KeyError, _Mapping]] = ...) -> None: ...

class CheckTxnStatusRequest(_message.Message):
    __slots__ = ("context", "primary_key", "lock_ts", "caller_start_ts", "current_ts", "rollback_if_not_exist")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_KEY_FIELD_NUMBER: _ClassVar[int]
    LOCK_TS_FIELD_NUMBER: _ClassVar[int]
    CALLER_START_TS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_IF_NOT_EXIST_FIELD_NUMBER: _ClassVar[int]
    context: Context
    primary_key: bytes
    lock_ts: int
    caller_start_ts: int
    current_ts: int
    rollback_if_not_exist: bool
    def __init__(self, context: _Optional[_Union[Context, _Mapping]] = ..., primary_key: _Optional[bytes] = ..., lock_ts: _Optional[int] = ..., caller_start_ts: _Optional[int] = ..., current_ts: _Optional[int] = ..., rollback_if_not_exist: _Optional[bool] = ...) -> None: ...

class CheckTxnStatusResponse(_message.Message):
    __slots__ = ("region_error", "error", "lock_ttl", "commit_version", "action", "lock_info")
    REGION_ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOCK_TTL_FIELD_NUMBER: _ClassVar[int]
    COMMIT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    LOCK_INFO_FIELD_NUMBER: _ClassVar[int]
    region_error: _errorpb_pb2.Error
    error: KeyError
    lock_ttl: int
    commit_version: int
    action: Action
    lock_info: LockInfo
    def __init__(self, region_error: _Optional[_Union[_errorpb_pb2.Error, _Mapping]] = ..., error: _Optional[_Union[KeyError, _Mapping]] = ..., lock_ttl: _Optional[int] = ..., commit_version: _Optional[int] = ..., action: _Optional[_Union[Action, str]] = ..., lock_info: _Optional[_Union[LockInfo, _Mapping]] = ...) -> None: ...

class ResolveLockRequest(_message.Message):
    __slots__ = ("context", "start_version", "commit_version", "keys")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    START_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_VERSION_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    context: Context
    start_version: int
    commit_version: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, context: _Optional[_Union[Context, _Mapping]] = ..., start_version: _Optional[int] = ..., commit_version: _Optional[int] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ResolveLockResponse(_message.Message):
    __slots__ = ("region_error", "error")
    REGION_ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    region_error: _errorpb_pb2.Error
    error: KeyError
    def __init__(self, region_error: _Optional[_Union[_errorpb_pb2.Error, _Mapping]] = ..., error: _Optional[_Union[KeyError, _Mapping]] = ...) -> None: ...

class ScanLockRequest(_message.Message):
    __slots__ = ("context", "max_version", "start_key", "limit", "end_key")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSION_FIELD_NUMBER: _ClassVar[int]
    START_KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    END_KEY_FIELD_NUMBER: _ClassVar[int]
    context: Context
    max_version: int
    start_key: bytes
    limit: int
    end_key: bytes
    def __init__(self, context: _Optional[_Union[Context, _Mapping]] = ..., max_version: _Optional[int] = ..., start_key: _Optional[bytes] = ..., limit: _Optional[int] = ..., end_key: _Optional[bytes] = ...) -> None: ...

class ScanLockResponse(_message.Message):
    __slots__ = ("region_error", "error", "locks")
    REGION_ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    region_error: _errorpb_pb2.Error
    error: KeyError
    locks: _containers.RepeatedCompositeFieldContainer[LockInfo]
    def __init__(self, region_error: _Optional[_Union[_errorpb_pb2.Error, _Mapping]] = ..., error: _Optional[_Union[KeyError, _Mapping]] = ..., locks: _Optional[_Iterable[_Union[LockInfo, _Mapping]]] = ...) -> None: ...
