from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MoECandidate(_message.Message):
    __slots__ = ["accepted", "backend", "experts_kernel", "reason"]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_KERNEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    backend: str
    experts_kernel: str
    reason: str
    def __init__(self, backend: _Optional[str] = ..., experts_kernel: _Optional[str] = ..., accepted: bool = ..., reason: _Optional[str] = ...) -> None: ...

class MoEPlan(_message.Message):
    __slots__ = ["activation_format", "activation_key", "backend", "backend_value", "candidates", "executable", "experts_kernel", "hidden_dim", "intermediate_size_per_partition", "layer", "log_line", "monolithic", "output_is_reduced", "prepare_finalize", "routing_method", "scheme", "topk_indices_dtype", "weight_key", "weight_layout"]
    ACTIVATION_FORMAT_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_KEY_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_VALUE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    EXECUTABLE_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_KERNEL_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_DIM_FIELD_NUMBER: _ClassVar[int]
    INTERMEDIATE_SIZE_PER_PARTITION_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    LOG_LINE_FIELD_NUMBER: _ClassVar[int]
    MONOLITHIC_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_IS_REDUCED_FIELD_NUMBER: _ClassVar[int]
    PREPARE_FINALIZE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_METHOD_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    TOPK_INDICES_DTYPE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_KEY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    activation_format: str
    activation_key: str
    backend: str
    backend_value: str
    candidates: _containers.RepeatedCompositeFieldContainer[MoECandidate]
    executable: bool
    experts_kernel: str
    hidden_dim: int
    intermediate_size_per_partition: int
    layer: str
    log_line: str
    monolithic: bool
    output_is_reduced: bool
    prepare_finalize: str
    routing_method: str
    scheme: str
    topk_indices_dtype: str
    weight_key: str
    weight_layout: str
    def __init__(self, layer: _Optional[str] = ..., scheme: _Optional[str] = ..., backend: _Optional[str] = ..., backend_value: _Optional[str] = ..., experts_kernel: _Optional[str] = ..., monolithic: bool = ..., activation_format: _Optional[str] = ..., prepare_finalize: _Optional[str] = ..., topk_indices_dtype: _Optional[str] = ..., output_is_reduced: bool = ..., hidden_dim: _Optional[int] = ..., intermediate_size_per_partition: _Optional[int] = ..., log_line: _Optional[str] = ..., candidates: _Optional[_Iterable[_Union[MoECandidate, _Mapping]]] = ..., executable: bool = ..., weight_key: _Optional[str] = ..., activation_key: _Optional[str] = ..., routing_method: _Optional[str] = ..., weight_layout: _Optional[str] = ...) -> None: ...
