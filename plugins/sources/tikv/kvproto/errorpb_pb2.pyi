from . import metapb_pb2 as _metapb_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NotLeader(_message.Message):
    __slots__ = ("region_id", "leader")
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    region_id: int
    leader: _metapb_pb2.Peer
    def __init__(self, region_id: _Optional[int] = ..., leader: _Optional[_Union[_metapb_pb2.Peer, _Mapping]] = ...) -> None: ...

class RegionNotFound(_message.Message):
    __slots__ = ("region_id",)
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    region_id: int
    def __init__(self, region_id: _Optional[int] = ...) -> None: ...

class EpochNotMatch(_message.Message):
    __slots__ = ("current_regions",)
    CURRENT_REGIONS_FIELD_NUMBER: _ClassVar[int]
    current_regions: _containers.RepeatedCompositeFieldContainer[_metapb_pb2.Region]
    def __init__(self, current_regions: _Optional[_Iterable[_Union[_metapb_pb2.Region, _Mapping]]] = ...) -> None: ...

class ServerIsBusy(_message.Message):
    __slots__ = ("reason", "backoff_ms", "estimated_wait_ms", "applied_index")
    REASON_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    reason: str
    backoff_ms: int
    estimated_wait_ms: int
    applied_index: int
    def __init__(self, reason: _Optional[str] = ..., backoff_ms: _Optional[int] = ..., estimated_wait_ms: _Optional[int] = ..., applied_index: _Optional[int] = ...) -> None: ...
