"""Python client for the kplan gRPC service (kplan.v1.KernelPlanService):
vLLM kernel plans (resolve), resident expert sets (load_experts,
load_experts_safetensors, list_experts, unload_experts) and execution
(run_moe, run_ir_op), with TLS, a bearer token, the server's message limit
and retries on UNAVAILABLE; RunMoE tensors by reference through POSIX shared
memory (shared_memory, kplan.shm) or this process's CUDA memory
(register_cuda_memory, kplan.cuda_ipc); RunMoE without gRPC on the call's
path through a shared-memory call channel (shm_channel, kplan.shm_channel).
The message classes are kplan.v1.*_pb2."""

from kplan import cuda_ipc, shm, shm_channel
from kplan.client import DEFAULT_MAX_MESSAGE_BYTES, Client, parse_platform
from kplan.errors import KplanError

__all__ = ["Client", "KplanError", "parse_platform", "DEFAULT_MAX_MESSAGE_BYTES", "cuda_ipc",
           "shm", "shm_channel"]
__version__ = "0.1.0"
