"""Python client for the kplan gRPC service.

The message classes are generated at build time from proto/ with the system
protoc and grpc_python_plugin (build/python); put that folder on sys.path or
PYTHONPATH, or pass its path to ``add_stub_path``.
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, Mapping, Optional

import grpc


def add_stub_path(path: str) -> None:
    """Makes the generated kplan.v1 modules importable from ``path``."""
    if path not in sys.path:
        sys.path.insert(0, path)


_default = os.environ.get("KPLAN_PYTHON_STUBS")
if _default:
    add_stub_path(_default)


def _stubs():
    from kplan.v1 import config_pb2, service_pb2, service_pb2_grpc  # noqa: E402

    return config_pb2, service_pb2, service_pb2_grpc


class KplanError(Exception):
    """A failed call: the gRPC code, the server's message and the offending field."""

    def __init__(self, code: grpc.StatusCode, message: str, field: Optional[str]):
        super().__init__(f"{code.name}: {message}" + (f" [field: {field}]" if field else ""))
        self.code = code
        self.message = message
        self.field = field


def _field_of(error: grpc.RpcError) -> Optional[str]:
    """The field named by a google.rpc.BadRequest detail, if the server sent one."""
    from google.rpc import error_details_pb2, status_pb2

    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                bad = error_details_pb2.BadRequest()
                if detail.Unpack(bad) and bad.field_violations:
                    return bad.field_violations[0].field
    return None


class Client:
    """A thin client: every call has a deadline (seconds)."""

    def __init__(self, target: str = "localhost:50051", timeout: float = 10.0):
        self._channel = grpc.insecure_channel(target)
        _, _, service_pb2_grpc = _stubs()
        self._stub = service_pb2_grpc.KernelPlanServiceStub(self._channel)
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request):
        try:
            return method(request, timeout=self._timeout)
        except grpc.RpcError as e:
            raise KplanError(e.code(), e.details(), _field_of(e)) from None

    def resolve(
        self,
        moe_backend: str = "",
        linear_backend: str = "",
        ir_op_priority: Optional[Mapping[str, Iterable[str]]] = None,
        platform: Optional[str] = None,
        architectures: Iterable[str] = (),
        all2all_backend: str = "",
        env: Optional[Mapping[str, str]] = None,
        request=None,
    ):
        """ResolveKernelConfig. ``platform`` is "cuda:9.0", "rocm:gfx950", "cpu"...
        (None: the server's own); ``request`` may be a full request message."""
        config_pb2, service_pb2, _ = _stubs()
        req = request or service_pb2.ResolveKernelConfigRequest()
        kc = req.kernel_config
        if moe_backend:
            kc.moe_backend = moe_backend
        if linear_backend:
            kc.linear_backend = linear_backend
        for op, providers in (ir_op_priority or {}).items():
            field = getattr(kc.ir_op_priority, op)
            del field[:]
            field.extend([providers] if isinstance(providers, str) else list(providers))
        if platform:
            req.platform.CopyFrom(parse_platform(platform))
        if architectures:
            req.model.architectures.extend(architectures)
        if all2all_backend:
            req.parallel.all2all_backend = all2all_backend
        for k, v in (env or {}).items():
            req.env[k] = v
        return self._call(self._stub.ResolveKernelConfig, req)

    def info(self):
        """GetServerInfo."""
        _, service_pb2, _ = _stubs()
        return self._call(self._stub.GetServerInfo, service_pb2.GetServerInfoRequest())

    # --- MoE execution -------------------------------------------------------

    def load_experts(self, experts_id: str, w13, w2, activation: str = "silu",
                     dtype: Optional[str] = None, chunk_bytes: int = 4 << 20):
        """LoadExperts from numpy arrays: w13 [E, 2I, H] (or [E, I, H] for *_no_mul
        activations) and w2 [E, H, I], float32 or float16. ``dtype="bfloat16"``
        sends float32 arrays rounded to bfloat16. Returns ExpertsInfo."""
        import numpy as np

        config_pb2, service_pb2, _ = _stubs()
        w13 = np.ascontiguousarray(w13)
        w2 = np.ascontiguousarray(w2)
        if w13.ndim != 3 or w2.ndim != 3:
            raise ValueError("w13 and w2 must be 3-D: [E, 2I, H] and [E, H, I]")
        wire, proto_dtype = _encode(w13, dtype)
        header = service_pb2.ExpertsHeader(
            experts_id=experts_id, num_experts=w2.shape[0], hidden_size=w2.shape[1],
            intermediate_size=w2.shape[2], activation=activation, dtype=proto_dtype)

        def messages():
            yield service_pb2.LoadExpertsRequest(header=header)
            for name, array in (("w13", w13), ("w2", w2)):
                data, _ = _encode(array, dtype)
                for offset in range(0, len(data), chunk_bytes):
                    chunk = service_pb2.TensorChunk(name=name, offset=offset,
                                                    data=data[offset:offset + chunk_bytes])
                    if offset == 0:
                        chunk.dtype = proto_dtype
                        chunk.shape.extend(array.shape)
                    yield service_pb2.LoadExpertsRequest(chunk=chunk)

        return self._call(self._stub.LoadExperts, messages()).experts

    def unload_experts(self, experts_id: str) -> int:
        """UnloadExperts; returns the bytes freed."""
        _, service_pb2, _ = _stubs()
        return self._call(self._stub.UnloadExperts,
                          service_pb2.UnloadExpertsRequest(experts_id=experts_id)).bytes_freed

    def list_experts(self):
        """ListExperts: a list of ExpertsInfo."""
        _, service_pb2, _ = _stubs()
        return list(self._call(self._stub.ListExperts, service_pb2.ListExpertsRequest()).experts)

    def run_moe(self, experts_id: str, hidden_states, router_logits=None, top_k: int = 2,
                routing_method: str = "RenormalizeNaive", topk_ids=None, topk_weights=None,
                dtype: Optional[str] = None, moe_backend: str = "auto", return_plan: bool = False,
                all2all_backend: str = ""):
        """RunMoE: hidden_states [M, H] (float32/float16; ``dtype="bfloat16"`` sends
        float32 rounded to bfloat16) with router_logits [M, E] and routing, or
        topk_ids/topk_weights [M, k]. ``all2all_backend`` picks the dispatch on a
        server with an expert-parallel group (allgather_reducescatter,
        kplan_all2allv). Returns the output as a numpy array (float32 for
        bfloat16), or (output, response) with ``return_plan``."""
        import numpy as np

        config_pb2, service_pb2, _ = _stubs()
        x = np.ascontiguousarray(hidden_states)
        data, proto_dtype = _encode(x, dtype)
        req = service_pb2.RunMoERequest(experts_id=experts_id)
        req.hidden_states.CopyFrom(config_pb2.Tensor(dtype=proto_dtype, shape=x.shape, data=data))
        req.kernel_config.moe_backend = moe_backend
        if all2all_backend:
            req.parallel.all2all_backend = all2all_backend
        if router_logits is not None:
            logits = np.ascontiguousarray(router_logits, dtype=np.float32)
            req.router_logits.CopyFrom(config_pb2.Tensor(
                dtype=config_pb2.DTYPE_FLOAT32, shape=logits.shape, data=logits.tobytes()))
            req.routing.top_k = top_k
            req.routing.routing_method = routing_method
        else:
            ids = np.ascontiguousarray(topk_ids, dtype=np.int32)
            weights = np.ascontiguousarray(topk_weights, dtype=np.float32)
            req.topk_ids.CopyFrom(config_pb2.Tensor(dtype=config_pb2.DTYPE_INT32, shape=ids.shape,
                                                    data=ids.tobytes()))
            req.topk_weights.CopyFrom(config_pb2.Tensor(
                dtype=config_pb2.DTYPE_FLOAT32, shape=weights.shape, data=weights.tobytes()))
        resp = self._call(self._stub.RunMoE, req)
        out = _decode(resp.output)
        return (out, resp) if return_plan else out

    def health(self, service: str = "") -> bool:
        """grpc.health.v1 Check: True when SERVING."""
        encoded = service.encode()
        request = (b"\x0a" + bytes([len(encoded)]) + encoded) if encoded else b""
        check = self._channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            response = check(request, timeout=self._timeout)
        except grpc.RpcError as e:
            raise KplanError(e.code(), e.details(), None) from None
        return response == b"\x08\x01"  # HealthCheckResponse{status: SERVING}


def _encode(array, dtype: Optional[str]):
    """Raw little-endian bytes of `array` and its DType; "bfloat16" rounds float32."""
    import numpy as np

    config_pb2, _, _ = _stubs()
    if dtype == "bfloat16":
        u = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
        rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        return rounded.tobytes(), config_pb2.DTYPE_BFLOAT16
    if array.dtype == np.float32:
        return array.astype("<f4").tobytes(), config_pb2.DTYPE_FLOAT32
    if array.dtype == np.float16:
        return array.astype("<f2").tobytes(), config_pb2.DTYPE_FLOAT16
    raise ValueError(f"unsupported dtype {array.dtype}; use float32, float16 or dtype='bfloat16'")


def _decode(tensor):
    """A Tensor message as a numpy array (bfloat16 widened to float32)."""
    import numpy as np

    config_pb2, _, _ = _stubs()
    if tensor.dtype == config_pb2.DTYPE_BFLOAT16:
        raw = np.frombuffer(tensor.data, dtype="<u2").astype(np.uint32) << 16
        values = raw.view(np.float32)
    elif tensor.dtype == config_pb2.DTYPE_FLOAT16:
        values = np.frombuffer(tensor.data, dtype="<f2")
    elif tensor.dtype == config_pb2.DTYPE_INT32:
        values = np.frombuffer(tensor.data, dtype="<i4")
    else:
        values = np.frombuffer(tensor.data, dtype="<f4")
    return values.reshape(tuple(tensor.shape))


def parse_platform(spec: str):
    """Parses "cuda:9.0[+lib,lib]", "rocm:gfx950", "cpu" into a Platform message."""
    config_pb2, _, _ = _stubs()
    kinds = {
        "cuda": config_pb2.PLATFORM_KIND_CUDA,
        "rocm": config_pb2.PLATFORM_KIND_ROCM,
        "cpu": config_pb2.PLATFORM_KIND_CPU,
        "xpu": config_pb2.PLATFORM_KIND_XPU,
        "tpu": config_pb2.PLATFORM_KIND_TPU,
        "oot": config_pb2.PLATFORM_KIND_OOT,
    }
    body, _, libs = spec.partition("+")
    kind, _, detail = body.partition(":")
    if kind not in kinds:
        raise ValueError(f"unknown platform kind {kind!r}; expected one of {sorted(kinds)}")
    p = config_pb2.Platform(kind=kinds[kind])
    if detail.startswith("gfx"):
        p.gcn_arch_name = detail
    elif detail:
        major, _, minor = detail.partition(".")
        p.device_capability.major = int(major)
        p.device_capability.minor = int(minor or 0)
    elif kind == "cuda":
        p.device_capability.major = 9
    if libs:
        p.libraries.extend(x for x in libs.split(",") if x)
    return p
