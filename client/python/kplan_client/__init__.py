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
