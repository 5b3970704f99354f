from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
DTYPE_BFLOAT16: DType
DTYPE_FLOAT16: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT8_E4M3: DType
DTYPE_INT32: DType
DTYPE_INT64: DType
DTYPE_INT8: DType
DTYPE_UINT8: DType
DTYPE_UNSPECIFIED: DType
PLATFORM_KIND_CPU: PlatformKind
PLATFORM_KIND_CUDA: PlatformKind
PLATFORM_KIND_OOT: PlatformKind
PLATFORM_KIND_ROCM: PlatformKind
PLATFORM_KIND_TPU: PlatformKind
PLATFORM_KIND_UNSPECIFIED: PlatformKind
PLATFORM_KIND_XPU: PlatformKind

class DeviceCapability(_message.Message):
    __slots__ = ["major", "minor"]
    MAJOR_FIELD_NUMBER: _ClassVar[int]
    MINOR_FIELD_NUMBER: _ClassVar[int]
    major: int
    minor: int
    def __init__(self, major: _Optional[int] = ..., minor: _Optional[int] = ...) -> None: ...

class IrOpPriorityConfig(_message.Message):
    __slots__ = ["fused_add_rms_norm", "gelu_and_mul_sparse", "rms_norm"]
    FUSED_ADD_RMS_NORM_FIELD_NUMBER: _ClassVar[int]
    GELU_AND_MUL_SPARSE_FIELD_NUMBER: _ClassVar[int]
    RMS_NORM_FIELD_NUMBER: _ClassVar[int]
    fused_add_rms_norm: _containers.RepeatedScalarFieldContainer[str]
    gelu_and_mul_sparse: _containers.RepeatedScalarFieldContainer[str]
    rms_norm: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rms_norm: _Optional[_Iterable[str]] = ..., fused_add_rms_norm: _Optional[_Iterable[str]] = ..., gelu_and_mul_sparse: _Optional[_Iterable[str]] = ...) -> None: ...

class KernelConfig(_message.Message):
    __slots__ = ["enable_cutedsl_warmup", "enable_flashinfer_autotune", "enable_jit_warmup", "enable_rocm_segmented_attn_autotune", "ir_op_priority", "linear_backend", "linear_backend_per_quant", "moe_backend", "monokernel", "sparse_indexer_topk_backend"]
    class LinearBackendPerQuantEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENABLE_CUTEDSL_WARMUP_FIELD_NUMBER: _ClassVar[int]
    ENABLE_FLASHINFER_AUTOTUNE_FIELD_NUMBER: _ClassVar[int]
    ENABLE_JIT_WARMUP_FIELD_NUMBER: _ClassVar[int]
    ENABLE_ROCM_SEGMENTED_ATTN_AUTOTUNE_FIELD_NUMBER: _ClassVar[int]
    IR_OP_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LINEAR_BACKEND_FIELD_NUMBER: _ClassVar[int]
    LINEAR_BACKEND_PER_QUANT_FIELD_NUMBER: _ClassVar[int]
    MOE_BACKEND_FIELD_NUMBER: _ClassVar[int]
    MONOKERNEL_FIELD_NUMBER: _ClassVar[int]
    SPARSE_INDEXER_TOPK_BACKEND_FIELD_NUMBER: _ClassVar[int]
    enable_cutedsl_warmup: bool
    enable_flashinfer_autotune: bool
    enable_jit_warmup: bool
    enable_rocm_segmented_attn_autotune: bool
    ir_op_priority: IrOpPriorityConfig
    linear_backend: str
    linear_backend_per_quant: _containers.ScalarMap[str, str]
    moe_backend: str
    monokernel: bool
    sparse_indexer_topk_backend: str
    def __init__(self, moe_backend: _Optional[str] = ..., linear_backend: _Optional[str] = ..., sparse_indexer_topk_backend: _Optional[str] = ..., ir_op_priority: _Optional[_Union[IrOpPriorityConfig, _Mapping]] = ..., enable_flashinfer_autotune: bool = ..., enable_rocm_segmented_attn_autotune: bool = ..., enable_cutedsl_warmup: bool = ..., enable_jit_warmup: bool = ..., monokernel: bool = ..., linear_backend_per_quant: _Optional[_Mapping[str, str]] = ...) -> None: ...

class MoELayerConfig(_message.Message):
    __slots__ = ["activation", "activation_quant", "allow_vllm_cutlass", "experts_per_token", "has_bias", "has_e_score_correction_bias", "hidden_dim", "in_dtype", "intermediate_size", "is_lora_enabled", "max_num_tokens", "name", "num_expert_group", "num_experts", "quant_scheme", "renormalize", "routed_scaling_factor", "router_logits_dtype", "routing_method", "scoring_func", "swiglu_limit", "topk_group", "weight_bits", "weight_quant"]
    ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_QUANT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_VLLM_CUTLASS_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    HAS_BIAS_FIELD_NUMBER: _ClassVar[int]
    HAS_E_SCORE_CORRECTION_BIAS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_DIM_FIELD_NUMBER: _ClassVar[int]
    INTERMEDIATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    IN_DTYPE_FIELD_NUMBER: _ClassVar[int]
    IS_LORA_ENABLED_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERT_GROUP_FIELD_NUMBER: _ClassVar[int]
    QUANT_SCHEME_FIELD_NUMBER: _ClassVar[int]
    RENORMALIZE_FIELD_NUMBER: _ClassVar[int]
    ROUTED_SCALING_FACTOR_FIELD_NUMBER: _ClassVar[int]
    ROUTER_LOGITS_DTYPE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_METHOD_FIELD_NUMBER: _ClassVar[int]
    SCORING_FUNC_FIELD_NUMBER: _ClassVar[int]
    SWIGLU_LIMIT_FIELD_NUMBER: _ClassVar[int]
    TOPK_GROUP_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BITS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_QUANT_FIELD_NUMBER: _ClassVar[int]
    activation: str
    activation_quant: str
    allow_vllm_cutlass: bool
    experts_per_token: int
    has_bias: bool
    has_e_score_correction_bias: bool
    hidden_dim: int
    in_dtype: str
    intermediate_size: int
    is_lora_enabled: bool
    max_num_tokens: int
    name: str
    num_expert_group: int
    num_experts: int
    quant_scheme: str
    renormalize: bool
    routed_scaling_factor: float
    router_logits_dtype: str
    routing_method: str
    scoring_func: str
    swiglu_limit: float
    topk_group: int
    weight_bits: int
    weight_quant: str
    def __init__(self, name: _Optional[str] = ..., num_experts: _Optional[int] = ..., experts_per_token: _Optional[int] = ..., hidden_dim: _Optional[int] = ..., intermediate_size: _Optional[int] = ..., activation: _Optional[str] = ..., routing_method: _Optional[str] = ..., scoring_func: _Optional[str] = ..., renormalize: bool = ..., num_expert_group: _Optional[int] = ..., topk_group: _Optional[int] = ..., has_e_score_correction_bias: bool = ..., routed_scaling_factor: _Optional[float] = ..., in_dtype: _Optional[str] = ..., router_logits_dtype: _Optional[str] = ..., weight_quant: _Optional[str] = ..., activation_quant: _Optional[str] = ..., is_lora_enabled: bool = ..., swiglu_limit: _Optional[float] = ..., has_bias: bool = ..., max_num_tokens: _Optional[int] = ..., allow_vllm_cutlass: bool = ..., weight_bits: _Optional[int] = ..., quant_scheme: _Optional[str] = ...) -> None: ...

class ModelConfig(_message.Message):
    __slots__ = ["architectures", "moe", "moe_layers"]
    ARCHITECTURES_FIELD_NUMBER: _ClassVar[int]
    MOE_FIELD_NUMBER: _ClassVar[int]
    MOE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    architectures: _containers.RepeatedScalarFieldContainer[str]
    moe: MoELayerConfig
    moe_layers: _containers.RepeatedCompositeFieldContainer[MoELayerConfig]
    def __init__(self, architectures: _Optional[_Iterable[str]] = ..., moe: _Optional[_Union[MoELayerConfig, _Mapping]] = ..., moe_layers: _Optional[_Iterable[_Union[MoELayerConfig, _Mapping]]] = ...) -> None: ...

class ParallelConfig(_message.Message):
    __slots__ = ["all2all_backend", "dp_rank", "dp_size", "enable_eplb", "enable_expert_parallel", "pcp_rank", "pcp_size", "sp_size", "tp_rank", "tp_size"]
    ALL2ALL_BACKEND_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    ENABLE_EPLB_FIELD_NUMBER: _ClassVar[int]
    ENABLE_EXPERT_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    PCP_RANK_FIELD_NUMBER: _ClassVar[int]
    PCP_SIZE_FIELD_NUMBER: _ClassVar[int]
    SP_SIZE_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    all2all_backend: str
    dp_rank: int
    dp_size: int
    enable_eplb: bool
    enable_expert_parallel: bool
    pcp_rank: int
    pcp_size: int
    sp_size: int
    tp_rank: int
    tp_size: int
    def __init__(self, tp_size: _Optional[int] = ..., dp_size: _Optional[int] = ..., pcp_size: _Optional[int] = ..., sp_size: _Optional[int] = ..., enable_expert_parallel: bool = ..., all2all_backend: _Optional[str] = ..., enable_eplb: bool = ..., tp_rank: _Optional[int] = ..., dp_rank: _Optional[int] = ..., pcp_rank: _Optional[int] = ...) -> None: ...

class Platform(_message.Message):
    __slots__ = ["device_capability", "device_name", "enforce_eager", "gcn_arch_name", "kind", "libraries", "use_inductor"]
    DEVICE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    ENFORCE_EAGER_FIELD_NUMBER: _ClassVar[int]
    GCN_ARCH_NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LIBRARIES_FIELD_NUMBER: _ClassVar[int]
    USE_INDUCTOR_FIELD_NUMBER: _ClassVar[int]
    device_capability: DeviceCapability
    device_name: str
    enforce_eager: bool
    gcn_arch_name: str
    kind: PlatformKind
    libraries: _containers.RepeatedScalarFieldContainer[str]
    use_inductor: bool
    def __init__(self, kind: _Optional[_Union[PlatformKind, str]] = ..., device_capability: _Optional[_Union[DeviceCapability, _Mapping]] = ..., device_name: _Optional[str] = ..., libraries: _Optional[_Iterable[str]] = ..., use_inductor: bool = ..., gcn_arch_name: _Optional[str] = ..., enforce_eager: bool = ...) -> None: ...

class SharedMemoryRef(_message.Message):
    __slots__ = ["byte_size", "offset", "region"]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    byte_size: int
    offset: int
    region: str
    def __init__(self, region: _Optional[str] = ..., offset: _Optional[int] = ..., byte_size: _Optional[int] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ["data", "dtype", "shape", "shm"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    shm: SharedMemoryRef
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., shm: _Optional[_Union[SharedMemoryRef, _Mapping]] = ...) -> None: ...

class PlatformKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
