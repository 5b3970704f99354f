from kplan.v1 import config_pb2 as _config_pb2
from kplan.v1 import plan_pb2 as _plan_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
EXPERTS_STATE_LOADING: ExpertsState
EXPERTS_STATE_READY: ExpertsState
EXPERTS_STATE_UNSPECIFIED: ExpertsState

class BuildInfo(_message.Message):
    __slots__ = ["compiler", "cuda_architectures", "cuda_version", "git_revision", "nccl_version", "version"]
    COMPILER_FIELD_NUMBER: _ClassVar[int]
    CUDA_ARCHITECTURES_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    GIT_REVISION_FIELD_NUMBER: _ClassVar[int]
    NCCL_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    compiler: str
    cuda_architectures: str
    cuda_version: str
    git_revision: str
    nccl_version: str
    version: str
    def __init__(self, version: _Optional[str] = ..., git_revision: _Optional[str] = ..., cuda_version: _Optional[str] = ..., nccl_version: _Optional[str] = ..., compiler: _Optional[str] = ..., cuda_architectures: _Optional[str] = ...) -> None: ...

class CloseShmChannelRequest(_message.Message):
    __slots__ = ["region"]
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: str
    def __init__(self, region: _Optional[str] = ...) -> None: ...

class CloseShmChannelResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class Device(_message.Message):
    __slots__ = ["capability", "index", "multiprocessor_count", "name", "total_memory_bytes"]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MULTIPROCESSOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    capability: _config_pb2.DeviceCapability
    index: int
    multiprocessor_count: int
    name: str
    total_memory_bytes: int
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., capability: _Optional[_Union[_config_pb2.DeviceCapability, _Mapping]] = ..., total_memory_bytes: _Optional[int] = ..., multiprocessor_count: _Optional[int] = ...) -> None: ...

class EpGroupInfo(_message.Message):
    __slots__ = ["all2all_backends", "communicator", "devices", "size"]
    ALL2ALL_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    COMMUNICATOR_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    all2all_backends: _containers.RepeatedScalarFieldContainer[str]
    communicator: str
    devices: _containers.RepeatedScalarFieldContainer[str]
    size: int
    def __init__(self, size: _Optional[int] = ..., devices: _Optional[_Iterable[str]] = ..., communicator: _Optional[str] = ..., all2all_backends: _Optional[_Iterable[str]] = ...) -> None: ...

class ExpertShard(_message.Message):
    __slots__ = ["bytes", "device", "first_expert", "num_experts", "rank"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    FIRST_EXPERT_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    device: str
    first_expert: int
    num_experts: int
    rank: int
    def __init__(self, rank: _Optional[int] = ..., device: _Optional[str] = ..., first_expert: _Optional[int] = ..., num_experts: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ExpertsHeader(_message.Message):
    __slots__ = ["activation", "dtype", "experts_id", "has_bias", "hidden_size", "intermediate_size", "num_experts", "quantization", "safetensors"]
    ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_BIAS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    INTERMEDIATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    SAFETENSORS_FIELD_NUMBER: _ClassVar[int]
    activation: str
    dtype: _config_pb2.DType
    experts_id: str
    has_bias: bool
    hidden_size: int
    intermediate_size: int
    num_experts: int
    quantization: ExpertsQuantization
    safetensors: SafetensorsSource
    def __init__(self, experts_id: _Optional[str] = ..., num_experts: _Optional[int] = ..., hidden_size: _Optional[int] = ..., intermediate_size: _Optional[int] = ..., activation: _Optional[str] = ..., dtype: _Optional[_Union[_config_pb2.DType, str]] = ..., quantization: _Optional[_Union[ExpertsQuantization, _Mapping]] = ..., safetensors: _Optional[_Union[SafetensorsSource, _Mapping]] = ..., has_bias: bool = ...) -> None: ...

class ExpertsInfo(_message.Message):
    __slots__ = ["activation", "bytes", "dtype", "experts_id", "hidden_size", "intermediate_size", "num_experts", "placement", "progress", "quantization", "shards", "state"]
    ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_ID_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    INTERMEDIATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    activation: str
    bytes: int
    dtype: _config_pb2.DType
    experts_id: str
    hidden_size: int
    intermediate_size: int
    num_experts: int
    placement: _containers.RepeatedCompositeFieldContainer[ExpertsPlacement]
    progress: ExpertsLoadProgress
    quantization: str
    shards: _containers.RepeatedCompositeFieldContainer[ExpertShard]
    state: ExpertsState
    def __init__(self, experts_id: _Optional[str] = ..., num_experts: _Optional[int] = ..., hidden_size: _Optional[int] = ..., intermediate_size: _Optional[int] = ..., activation: _Optional[str] = ..., dtype: _Optional[_Union[_config_pb2.DType, str]] = ..., quantization: _Optional[str] = ..., bytes: _Optional[int] = ..., placement: _Optional[_Iterable[_Union[ExpertsPlacement, _Mapping]]] = ..., shards: _Optional[_Iterable[_Union[ExpertShard, _Mapping]]] = ..., state: _Optional[_Union[ExpertsState, str]] = ..., progress: _Optional[_Union[ExpertsLoadProgress, _Mapping]] = ...) -> None: ...

class ExpertsLoadProgress(_message.Message):
    __slots__ = ["bytes_done", "bytes_total", "experts_done", "experts_total", "preload"]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_DONE_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PRELOAD_FIELD_NUMBER: _ClassVar[int]
    bytes_done: int
    bytes_total: int
    experts_done: int
    experts_total: int
    preload: bool
    def __init__(self, bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., experts_done: _Optional[int] = ..., experts_total: _Optional[int] = ..., preload: bool = ...) -> None: ...

class ExpertsPlacement(_message.Message):
    __slots__ = ["bytes", "device", "first_expert", "num_experts"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    FIRST_EXPERT_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    device: str
    first_expert: int
    num_experts: int
    def __init__(self, device: _Optional[str] = ..., first_expert: _Optional[int] = ..., num_experts: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ExpertsQuantization(_message.Message):
    __slots__ = ["a1_scale", "a2_scale", "activation_scale", "block_k", "block_n", "group_size", "has_zero_points", "scheme"]
    A1_SCALE_FIELD_NUMBER: _ClassVar[int]
    A2_SCALE_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_SCALE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_K_FIELD_NUMBER: _ClassVar[int]
    BLOCK_N_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    HAS_ZERO_POINTS_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    a1_scale: float
    a2_scale: float
    activation_scale: str
    block_k: int
    block_n: int
    group_size: int
    has_zero_points: bool
    scheme: str
    def __init__(self, scheme: _Optional[str] = ..., block_n: _Optional[int] = ..., block_k: _Optional[int] = ..., group_size: _Optional[int] = ..., has_zero_points: bool = ..., activation_scale: _Optional[str] = ..., a1_scale: _Optional[float] = ..., a2_scale: _Optional[float] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetServerInfoResponse(_message.Message):
    __slots__ = ["build", "cuda_driver_version", "devices", "ep_group", "executable_backends", "ir_op_priority", "limits", "platform", "version"]
    BUILD_FIELD_NUMBER: _ClassVar[int]
    CUDA_DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    EP_GROUP_FIELD_NUMBER: _ClassVar[int]
    EXECUTABLE_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    IR_OP_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    build: BuildInfo
    cuda_driver_version: str
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    ep_group: EpGroupInfo
    executable_backends: _containers.RepeatedScalarFieldContainer[str]
    ir_op_priority: _config_pb2.IrOpPriorityConfig
    limits: ServerLimits
    platform: _config_pb2.Platform
    version: str
    def __init__(self, version: _Optional[str] = ..., build: _Optional[_Union[BuildInfo, _Mapping]] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., platform: _Optional[_Union[_config_pb2.Platform, _Mapping]] = ..., executable_backends: _Optional[_Iterable[str]] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ..., cuda_driver_version: _Optional[str] = ..., ir_op_priority: _Optional[_Union[_config_pb2.IrOpPriorityConfig, _Mapping]] = ..., ep_group: _Optional[_Union[EpGroupInfo, _Mapping]] = ...) -> None: ...

class JoinEpGroupRequest(_message.Message):
    __slots__ = ["address", "device", "instance", "rank", "size"]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    address: str
    device: str
    instance: str
    rank: int
    size: int
    def __init__(self, rank: _Optional[int] = ..., size: _Optional[int] = ..., address: _Optional[str] = ..., device: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class JoinEpGroupResponse(_message.Message):
    __slots__ = ["generation", "group_id", "size"]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    generation: int
    group_id: bytes
    size: int
    def __init__(self, group_id: _Optional[bytes] = ..., generation: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class ListExpertsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListExpertsResponse(_message.Message):
    __slots__ = ["experts"]
    EXPERTS_FIELD_NUMBER: _ClassVar[int]
    experts: _containers.RepeatedCompositeFieldContainer[ExpertsInfo]
    def __init__(self, experts: _Optional[_Iterable[_Union[ExpertsInfo, _Mapping]]] = ...) -> None: ...

class ListSharedMemoryRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListSharedMemoryResponse(_message.Message):
    __slots__ = ["regions"]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedCompositeFieldContainer[SharedMemoryRegion]
    def __init__(self, regions: _Optional[_Iterable[_Union[SharedMemoryRegion, _Mapping]]] = ...) -> None: ...

class LoadExpertsRequest(_message.Message):
    __slots__ = ["chunk", "header"]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    chunk: TensorChunk
    header: ExpertsHeader
    def __init__(self, header: _Optional[_Union[ExpertsHeader, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class LoadExpertsResponse(_message.Message):
    __slots__ = ["experts"]
    EXPERTS_FIELD_NUMBER: _ClassVar[int]
    experts: ExpertsInfo
    def __init__(self, experts: _Optional[_Union[ExpertsInfo, _Mapping]] = ...) -> None: ...

class MoEExecution(_message.Message):
    __slots__ = ["all2all_backend", "backend", "candidates", "devices", "dispatch", "ep_size", "experts_kernel"]
    ALL2ALL_BACKEND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    EP_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_KERNEL_FIELD_NUMBER: _ClassVar[int]
    all2all_backend: str
    backend: str
    candidates: _containers.RepeatedCompositeFieldContainer[_plan_pb2.MoECandidate]
    devices: _containers.RepeatedScalarFieldContainer[str]
    dispatch: str
    ep_size: int
    experts_kernel: str
    def __init__(self, backend: _Optional[str] = ..., experts_kernel: _Optional[str] = ..., dispatch: _Optional[str] = ..., devices: _Optional[_Iterable[str]] = ..., all2all_backend: _Optional[str] = ..., ep_size: _Optional[int] = ..., candidates: _Optional[_Iterable[_Union[_plan_pb2.MoECandidate, _Mapping]]] = ...) -> None: ...

class MoETiming(_message.Message):
    __slots__ = ["coalesced_requests", "decoded_at_us", "device_end_at_us", "device_start_at_us", "device_us", "encoded_at_us", "queue_us", "queued_at_us", "total_us"]
    COALESCED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DECODED_AT_US_FIELD_NUMBER: _ClassVar[int]
    DEVICE_END_AT_US_FIELD_NUMBER: _ClassVar[int]
    DEVICE_START_AT_US_FIELD_NUMBER: _ClassVar[int]
    DEVICE_US_FIELD_NUMBER: _ClassVar[int]
    ENCODED_AT_US_FIELD_NUMBER: _ClassVar[int]
    QUEUED_AT_US_FIELD_NUMBER: _ClassVar[int]
    QUEUE_US_FIELD_NUMBER: _ClassVar[int]
    TOTAL_US_FIELD_NUMBER: _ClassVar[int]
    coalesced_requests: int
    decoded_at_us: float
    device_end_at_us: float
    device_start_at_us: float
    device_us: float
    encoded_at_us: float
    queue_us: float
    queued_at_us: float
    total_us: float
    def __init__(self, queue_us: _Optional[float] = ..., device_us: _Optional[float] = ..., total_us: _Optional[float] = ..., decoded_at_us: _Optional[float] = ..., queued_at_us: _Optional[float] = ..., device_start_at_us: _Optional[float] = ..., device_end_at_us: _Optional[float] = ..., encoded_at_us: _Optional[float] = ..., coalesced_requests: _Optional[int] = ...) -> None: ...

class NamedTensor(_message.Message):
    __slots__ = ["name", "tensor"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    tensor: _config_pb2.Tensor
    def __init__(self, name: _Optional[str] = ..., tensor: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ...) -> None: ...

class OpenShmChannelRequest(_message.Message):
    __slots__ = ["region", "request_capacity"]
    REGION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    region: str
    request_capacity: int
    def __init__(self, region: _Optional[str] = ..., request_capacity: _Optional[int] = ...) -> None: ...

class OpenShmChannelResponse(_message.Message):
    __slots__ = ["response_capacity"]
    RESPONSE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    response_capacity: int
    def __init__(self, response_capacity: _Optional[int] = ...) -> None: ...

class RegisterSharedMemoryRequest(_message.Message):
    __slots__ = ["region"]
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: SharedMemoryRegion
    def __init__(self, region: _Optional[_Union[SharedMemoryRegion, _Mapping]] = ...) -> None: ...

class RegisterSharedMemoryResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ResolveKernelConfigRequest(_message.Message):
    __slots__ = ["env", "kernel_config", "model", "parallel", "platform"]
    class EnvEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENV_FIELD_NUMBER: _ClassVar[int]
    KERNEL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    env: _containers.ScalarMap[str, str]
    kernel_config: _config_pb2.KernelConfig
    model: _config_pb2.ModelConfig
    parallel: _config_pb2.ParallelConfig
    platform: _config_pb2.Platform
    def __init__(self, kernel_config: _Optional[_Union[_config_pb2.KernelConfig, _Mapping]] = ..., model: _Optional[_Union[_config_pb2.ModelConfig, _Mapping]] = ..., parallel: _Optional[_Union[_config_pb2.ParallelConfig, _Mapping]] = ..., platform: _Optional[_Union[_config_pb2.Platform, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResolveKernelConfigResponse(_message.Message):
    __slots__ = ["config_hash", "kernel_config", "moe_layer_plans", "moe_plan", "parallel", "platform", "warnings"]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    KERNEL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    MOE_LAYER_PLANS_FIELD_NUMBER: _ClassVar[int]
    MOE_PLAN_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    config_hash: str
    kernel_config: _config_pb2.KernelConfig
    moe_layer_plans: _containers.RepeatedCompositeFieldContainer[_plan_pb2.MoEPlan]
    moe_plan: _plan_pb2.MoEPlan
    parallel: _config_pb2.ParallelConfig
    platform: _config_pb2.Platform
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kernel_config: _Optional[_Union[_config_pb2.KernelConfig, _Mapping]] = ..., parallel: _Optional[_Union[_config_pb2.ParallelConfig, _Mapping]] = ..., config_hash: _Optional[str] = ..., moe_plan: _Optional[_Union[_plan_pb2.MoEPlan, _Mapping]] = ..., moe_layer_plans: _Optional[_Iterable[_Union[_plan_pb2.MoEPlan, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ..., platform: _Optional[_Union[_config_pb2.Platform, _Mapping]] = ...) -> None: ...

class RoutingConfig(_message.Message):
    __slots__ = ["e_score_correction_bias", "num_expert_group", "routed_scaling_factor", "routing_method", "top_k", "topk_group"]
    E_SCORE_CORRECTION_BIAS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERT_GROUP_FIELD_NUMBER: _ClassVar[int]
    ROUTED_SCALING_FACTOR_FIELD_NUMBER: _ClassVar[int]
    ROUTING_METHOD_FIELD_NUMBER: _ClassVar[int]
    TOPK_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    e_score_correction_bias: _config_pb2.Tensor
    num_expert_group: int
    routed_scaling_factor: float
    routing_method: str
    top_k: int
    topk_group: int
    def __init__(self, top_k: _Optional[int] = ..., routing_method: _Optional[str] = ..., num_expert_group: _Optional[int] = ..., topk_group: _Optional[int] = ..., routed_scaling_factor: _Optional[float] = ..., e_score_correction_bias: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ...) -> None: ...

class RunEpStepRequest(_message.Message):
    __slots__ = ["all2all_backend", "apply_router_weight_on_input", "experts_id", "generation", "group_id", "hidden_states", "rank", "size", "top_k", "topk_ids", "topk_weights"]
    ALL2ALL_BACKEND_FIELD_NUMBER: _ClassVar[int]
    APPLY_ROUTER_WEIGHT_ON_INPUT_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_STATES_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TOPK_IDS_FIELD_NUMBER: _ClassVar[int]
    TOPK_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    all2all_backend: str
    apply_router_weight_on_input: bool
    experts_id: str
    generation: int
    group_id: bytes
    hidden_states: _config_pb2.Tensor
    rank: int
    size: int
    top_k: int
    topk_ids: _config_pb2.Tensor
    topk_weights: _config_pb2.Tensor
    def __init__(self, experts_id: _Optional[str] = ..., generation: _Optional[int] = ..., group_id: _Optional[bytes] = ..., rank: _Optional[int] = ..., size: _Optional[int] = ..., top_k: _Optional[int] = ..., hidden_states: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ..., topk_ids: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ..., topk_weights: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ..., apply_router_weight_on_input: bool = ..., all2all_backend: _Optional[str] = ...) -> None: ...

class RunEpStepResponse(_message.Message):
    __slots__ = ["output"]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    output: _config_pb2.Tensor
    def __init__(self, output: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ...) -> None: ...

class RunIrOpRequest(_message.Message):
    __slots__ = ["approximate", "device", "epsilon", "inputs", "op", "priority", "std_multiplier", "variance_size"]
    APPROXIMATE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STD_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    VARIANCE_SIZE_FIELD_NUMBER: _ClassVar[int]
    approximate: str
    device: str
    epsilon: float
    inputs: _containers.RepeatedCompositeFieldContainer[NamedTensor]
    op: str
    priority: _containers.RepeatedScalarFieldContainer[str]
    std_multiplier: float
    variance_size: int
    def __init__(self, op: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[NamedTensor, _Mapping]]] = ..., epsilon: _Optional[float] = ..., variance_size: _Optional[int] = ..., std_multiplier: _Optional[float] = ..., approximate: _Optional[str] = ..., priority: _Optional[_Iterable[str]] = ..., device: _Optional[str] = ...) -> None: ...

class RunIrOpResponse(_message.Message):
    __slots__ = ["device", "outputs", "priority", "provider", "provider_uuid", "warnings"]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_UUID_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    device: str
    outputs: _containers.RepeatedCompositeFieldContainer[NamedTensor]
    priority: _containers.RepeatedScalarFieldContainer[str]
    provider: str
    provider_uuid: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, outputs: _Optional[_Iterable[_Union[NamedTensor, _Mapping]]] = ..., provider: _Optional[str] = ..., provider_uuid: _Optional[str] = ..., priority: _Optional[_Iterable[str]] = ..., warnings: _Optional[_Iterable[str]] = ..., device: _Optional[str] = ...) -> None: ...

class RunMoERequest(_message.Message):
    __slots__ = ["apply_router_weight_on_input", "experts_id", "explain", "hidden_states", "kernel_config", "output_shm", "parallel", "return_routing", "router_logits", "routing", "skip_device", "topk_ids", "topk_weights"]
    APPLY_ROUTER_WEIGHT_ON_INPUT_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_ID_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_STATES_FIELD_NUMBER: _ClassVar[int]
    KERNEL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SHM_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    RETURN_ROUTING_FIELD_NUMBER: _ClassVar[int]
    ROUTER_LOGITS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    SKIP_DEVICE_FIELD_NUMBER: _ClassVar[int]
    TOPK_IDS_FIELD_NUMBER: _ClassVar[int]
    TOPK_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    apply_router_weight_on_input: bool
    experts_id: str
    explain: bool
    hidden_states: _config_pb2.Tensor
    kernel_config: _config_pb2.KernelConfig
    output_shm: _config_pb2.SharedMemoryRef
    parallel: _config_pb2.ParallelConfig
    return_routing: bool
    router_logits: _config_pb2.Tensor
    routing: RoutingConfig
    skip_device: bool
    topk_ids: _config_pb2.Tensor
    topk_weights: _config_pb2.Tensor
    def __init__(self, experts_id: _Optional[str] = ..., hidden_states: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ..., router_logits: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ..., routing: _Optional[_Union[RoutingConfig, _Mapping]] = ..., topk_ids: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ..., topk_weights: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ..., apply_router_weight_on_input: bool = ..., kernel_config: _Optional[_Union[_config_pb2.KernelConfig, _Mapping]] = ..., return_routing: bool = ..., parallel: _Optional[_Union[_config_pb2.ParallelConfig, _Mapping]] = ..., explain: bool = ..., skip_device: bool = ..., output_shm: _Optional[_Union[_config_pb2.SharedMemoryRef, _Mapping]] = ...) -> None: ...

class RunMoEResponse(_message.Message):
    __slots__ = ["output", "plan", "timing", "topk_ids", "topk_weights"]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    TOPK_IDS_FIELD_NUMBER: _ClassVar[int]
    TOPK_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    output: _config_pb2.Tensor
    plan: MoEExecution
    timing: MoETiming
    topk_ids: _config_pb2.Tensor
    topk_weights: _config_pb2.Tensor
    def __init__(self, output: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ..., plan: _Optional[_Union[MoEExecution, _Mapping]] = ..., timing: _Optional[_Union[MoETiming, _Mapping]] = ..., topk_ids: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ..., topk_weights: _Optional[_Union[_config_pb2.Tensor, _Mapping]] = ...) -> None: ...

class SafetensorsSource(_message.Message):
    __slots__ = ["down_proj", "gate_proj", "path", "up_proj", "w13", "w2"]
    DOWN_PROJ_FIELD_NUMBER: _ClassVar[int]
    GATE_PROJ_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    UP_PROJ_FIELD_NUMBER: _ClassVar[int]
    W13_FIELD_NUMBER: _ClassVar[int]
    W2_FIELD_NUMBER: _ClassVar[int]
    down_proj: str
    gate_proj: str
    path: str
    up_proj: str
    w13: str
    w2: str
    def __init__(self, path: _Optional[str] = ..., w13: _Optional[str] = ..., w2: _Optional[str] = ..., gate_proj: _Optional[str] = ..., up_proj: _Optional[str] = ..., down_proj: _Optional[str] = ...) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ["max_message_bytes"]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    def __init__(self, max_message_bytes: _Optional[int] = ...) -> None: ...

class SharedMemoryRegion(_message.Message):
    __slots__ = ["byte_size", "cuda_ipc_handle", "device_id", "key", "name", "offset"]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_HANDLE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    byte_size: int
    cuda_ipc_handle: bytes
    device_id: int
    key: str
    name: str
    offset: int
    def __init__(self, name: _Optional[str] = ..., key: _Optional[str] = ..., offset: _Optional[int] = ..., byte_size: _Optional[int] = ..., cuda_ipc_handle: _Optional[bytes] = ..., device_id: _Optional[int] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ["data", "dtype", "name", "offset", "shape"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    dtype: _config_pb2.DType
    name: str
    offset: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[_config_pb2.DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UnloadExpertsRequest(_message.Message):
    __slots__ = ["experts_id"]
    EXPERTS_ID_FIELD_NUMBER: _ClassVar[int]
    experts_id: str
    def __init__(self, experts_id: _Optional[str] = ...) -> None: ...

class UnloadExpertsResponse(_message.Message):
    __slots__ = ["bytes_freed"]
    BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    bytes_freed: int
    def __init__(self, bytes_freed: _Optional[int] = ...) -> None: ...

class UnregisterSharedMemoryRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnregisterSharedMemoryResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ExpertsState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
