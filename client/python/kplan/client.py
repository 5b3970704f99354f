"""kplan.Client: the kplan.v1.KernelPlanService over gRPC."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Literal, Mapping, Optional,
                    Sequence, Tuple, TypeVar, Union, overload)

import grpc
import numpy as np
import numpy.typing as npt

from kplan import _tensors, cuda_ipc, safetensors, shm, shm_channel
from kplan.errors import KplanError, field_of
from kplan.v1 import config_pb2, service_pb2, service_pb2_grpc

try:  # grpcio-health-checking when installed, else ours
    from grpc_health.v1 import health_pb2, health_pb2_grpc
except ImportError:
    from kplan._vendor.health import health_pb2, health_pb2_grpc

# gRPC's own default is 4 MiB; kplan-server allows 64 MiB unless started with
# another --max_message_bytes, which GetServerInfo reports.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20

_T = TypeVar("_T")
PathOrBytes = Union[str, "os.PathLike[str]", bytes]
# Called with a set's ExpertsInfo while it loads (load_experts' progress=).
ProgressCallback = Callable[[service_pb2.ExpertsInfo], None]


def _read(value: Optional[PathOrBytes]) -> Optional[bytes]:
    """PEM given as bytes, or the file a path names."""
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


class Client:
    """A client for one kplan-server.

    ``target``: HOST:PORT or unix:/path.sock. ``timeout``: the deadline of each
    call in seconds, retries included (a load's default grows with its size:
    ``load_timeout``). TLS when ``root_certificates`` is given
    (PEM bytes or a path), mutual TLS with ``certificate_chain`` and
    ``private_key``. ``token`` (default ``$KPLAN_TOKEN``) is sent as
    ``authorization: Bearer <token>``. ``max_message_bytes``: None matches the
    server's limit (read once from GetServerInfo before the first tensor call;
    64 MiB until then). Calls failing with UNAVAILABLE are retried up to
    ``retries`` times, ``backoff`` seconds doubling each time (with jitter),
    while the deadline allows.
    """

    def __init__(self, target: str = "localhost:50051", timeout: float = 10.0, *,
                 root_certificates: Optional[PathOrBytes] = None,
                 certificate_chain: Optional[PathOrBytes] = None,
                 private_key: Optional[PathOrBytes] = None,
                 token: Optional[str] = None,
                 max_message_bytes: Optional[int] = None,
                 retries: int = 3, backoff: float = 0.1, max_backoff: float = 2.0):
        if (certificate_chain is None) != (private_key is None):
            raise ValueError("mutual TLS needs both certificate_chain and private_key")
        if certificate_chain is not None and root_certificates is None:
            raise ValueError("certificate_chain/private_key need root_certificates (TLS)")
        self._target = target
        self._timeout = timeout
        self._credentials = None
        if root_certificates is not None:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(root_certificates), private_key=_read(private_key),
                certificate_chain=_read(certificate_chain))
        token = token if token is not None else os.environ.get("KPLAN_TOKEN")
        self._metadata: Tuple[Tuple[str, str], ...] = (
            (("authorization", f"Bearer {token.strip()}"),) if token else ())
        self._retries = retries
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._auto_limit = max_message_bytes is None
        self._lock = threading.Lock()
        self._connect(max_message_bytes or DEFAULT_MAX_MESSAGE_BYTES)

    # Seconds between ListExperts polls of a load's progress callback.
    progress_interval: float = 0.2

    def _connect(self, max_message_bytes: int) -> None:
        options = [("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.max_receive_message_length", max_message_bytes)]
        if self._credentials is not None:
            channel = grpc.secure_channel(self._target, self._credentials, options=options)
        else:
            channel = grpc.insecure_channel(self._target, options=options)
        self._channel = channel
        self._stub = service_pb2_grpc.KernelPlanServiceStub(channel)
        self._health = health_pb2_grpc.HealthStub(channel)
        self.max_message_bytes = max_message_bytes

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Callable[[Any], Callable[..., _T]], make_request: Callable[[], Any],
              timeout: Optional[float] = None) -> _T:
        """Calls ``method(stub)`` with a fresh ``make_request()`` per attempt."""
        deadline = time.monotonic() + (timeout if timeout is not None else self._timeout)
        attempt = 0
        while True:
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                return method(self._stub)(make_request(), timeout=remaining,
                                          metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE and attempt < self._retries:
                    delay = min(self._backoff * 2 ** attempt, self._max_backoff)
                    delay *= random.uniform(0.5, 1.0)
                    if time.monotonic() + delay < deadline:
                        attempt += 1
                        time.sleep(delay)
                        continue
                message = e.details() or ""
                if (e.code() == grpc.StatusCode.UNAVAILABLE and
                        message.startswith("failed to connect to all addresses")):
                    # gRPC's own text, not a draining server's: nothing answered.
                    message += (f"; no kplan-server answered at {self._target} " + (
                        "over TLS (is it running there, serving TLS with a certificate for "
                        "this name signed by root_certificates? one asking for client "
                        "certificates needs certificate_chain= and private_key=)"
                        if self._credentials else
                        "over plaintext (is it running there? one serving TLS needs "
                        "root_certificates=)"))
                raise KplanError(e.code(), message, field_of(e)) from None

    def _match_server_limit(self) -> None:
        """Once: the channel's message limits become the server's."""
        if not self._auto_limit:
            return
        with self._lock:
            if not self._auto_limit:
                return
            limit = self.info().limits.max_message_bytes or DEFAULT_MAX_MESSAGE_BYTES
            self._auto_limit = False
            if limit != self.max_message_bytes:
                old = self._channel
                self._connect(limit)
                old.close()

    # --- plans -----------------------------------------------------------------

    def resolve(self, moe_backend: str = "", linear_backend: str = "",
                ir_op_priority: Optional[Mapping[str, Union[str, Iterable[str]]]] = None,
                platform: Optional[str] = None, architectures: Iterable[str] = (),
                all2all_backend: str = "", env: Optional[Mapping[str, str]] = None,
                request: Optional[service_pb2.ResolveKernelConfigRequest] = None
                ) -> service_pb2.ResolveKernelConfigResponse:
        """ResolveKernelConfig. ``platform`` is "cuda:9.0", "rocm:gfx950", "cpu"...
        (None: the server's own); ``request`` may be a full request message."""
        req = service_pb2.ResolveKernelConfigRequest()
        if request is not None:
            req.CopyFrom(request)
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
        return self._call(lambda s: s.ResolveKernelConfig, lambda: req)

    def info(self) -> service_pb2.GetServerInfoResponse:
        """GetServerInfo: version, devices, platform, limits."""
        return self._call(lambda s: s.GetServerInfo, service_pb2.GetServerInfoRequest)

    def health(self, service: str = "") -> bool:
        """grpc.health.v1 Check: True when SERVING ("" the server,
        "kplan.v1.KernelPlanService" readiness)."""
        request = health_pb2.HealthCheckRequest(service=service)
        response = self._call(lambda s: self._health.Check, lambda: request)
        return response.status == health_pb2.HealthCheckResponse.SERVING

    # --- experts -------------------------------------------------------------------

    def load_experts(self, experts_id: str, w13: npt.ArrayLike, w2: npt.ArrayLike,
                     activation: str = "silu", dtype: Optional[str] = None,
                     chunk_bytes: int = 4 << 20, timeout: Optional[float] = None,
                     progress: Optional[ProgressCallback] = None) -> service_pb2.ExpertsInfo:
        """LoadExperts from numpy arrays: w13 [E, 2I, H] (or [E, I, H] for *_no_mul
        activations) and w2 [E, H, I], float32 or float16; ``dtype="bfloat16"``
        sends float32 rounded to bfloat16. Returns the set's ExpertsInfo.
        ``progress`` is called with the set as the server reports it while it
        loads (``state`` LOADING, ``progress.bytes_done`` ...; see ``_load``)."""
        a13, a2 = np.ascontiguousarray(w13), np.ascontiguousarray(w2)
        if a13.ndim != 3 or a2.ndim != 3:
            raise ValueError("w13 and w2 must be 3-D: [E, 2I, H] and [E, H, I]")
        encoded = [(name, a.shape) + _tensors.encode(a, dtype) for name, a in
                   (("w13", a13), ("w2", a2))]
        header = service_pb2.ExpertsHeader(
            experts_id=experts_id, num_experts=a2.shape[0], hidden_size=a2.shape[1],
            intermediate_size=a2.shape[2], activation=activation, dtype=encoded[0][3])

        def chunks() -> Iterator[service_pb2.TensorChunk]:
            for name, shape, data, proto in encoded:
                for offset in range(0, len(data), chunk_bytes):
                    chunk = service_pb2.TensorChunk(name=name, offset=offset,
                                                    data=data[offset:offset + chunk_bytes])
                    if offset == 0:
                        chunk.dtype = proto
                        chunk.shape.extend(shape)
                    yield chunk

        return self._load(header, chunks, timeout, progress)

    def load_experts_safetensors(self, experts_id: str, path: "str | os.PathLike[str]", *,
                                 w13: Optional[str] = None, w2: Optional[str] = None,
                                 template: Optional[str] = None, activation: str = "silu",
                                 chunk_bytes: int = 4 << 20, timeout: Optional[float] = None,
                                 progress: Optional[ProgressCallback] = None
                                 ) -> service_pb2.ExpertsInfo:
        """LoadExperts from a safetensors file on this machine, streamed in chunks of
        ``chunk_bytes`` (never read whole): stacked tensors named by ``w13`` [E, 2I, H]
        and ``w2`` [E, H, I], or per-expert ones named by ``template`` with {e} and
        {proj} (gate_proj, up_proj [I, H], down_proj [H, I]), e.g.
        "model.layers.0.mlp.experts.{e}.{proj}.weight". F32, F16 or BF16.
        ``progress`` as in ``load_experts``."""
        tensors = safetensors.read_header(path)
        gated = not activation.endswith("_no_mul")

        def get(name: str) -> safetensors.TensorInfo:
            if name not in tensors:
                raise ValueError(f"{path}: no tensor {name!r}")
            return tensors[name]

        if w13 is not None and w2 is not None:
            t13, t2 = get(w13), get(w2)
            parts13, parts2 = [t13], [t2]
            shape13, shape2 = t13.shape, t2.shape
        elif template is not None:
            if "{e}" not in template or "{proj}" not in template:
                raise ValueError("template needs {e} and {proj}")
            up = [get(n) for n in safetensors.expert_names(template, "up_proj", tensors)]
            if not up:
                raise ValueError(f"{path}: no tensor {template.replace('{proj}', 'up_proj')!r} "
                                 "for expert 0")
            gate = [get(n) for n in safetensors.expert_names(template, "gate_proj", tensors)]
            down = [get(n) for n in safetensors.expert_names(template, "down_proj", tensors)]
            if len(down) != len(up) or (gated and len(gate) != len(up)):
                raise ValueError(f"{path}: {len(gate)} gate_proj, {len(up)} up_proj and "
                                 f"{len(down)} down_proj tensors")
            parts13 = [p for e in range(len(up)) for p in ((gate[e], up[e]) if gated else
                                                           (up[e],))]
            parts2 = down
            i, h = up[0].shape
            shape13 = (len(up), (2 if gated else 1) * i, h)
            shape2 = (len(up),) + tuple(down[0].shape)
        else:
            raise ValueError("name the tensors: w13= and w2=, or template=")
        if len(shape13) != 3 or len(shape2) != 3:
            raise ValueError(f"w13 {shape13} and w2 {shape2} must be [E, 2I, H] and [E, H, I]")
        dtypes = {t.dtype for t in parts13 + parts2}
        if len(dtypes) != 1:
            raise ValueError(f"{path}: the expert tensors mix dtypes {sorted(dtypes)}")
        proto, _ = safetensors.proto_dtype(parts13[0])
        header = service_pb2.ExpertsHeader(
            experts_id=experts_id, num_experts=shape2[0], hidden_size=shape2[1],
            intermediate_size=shape2[2], activation=activation, dtype=proto)

        def chunks() -> Iterator[service_pb2.TensorChunk]:
            with open(path, "rb") as f:
                yield from safetensors.chunks(f, "w13", parts13, shape13, proto, chunk_bytes)
                yield from safetensors.chunks(f, "w2", parts2, shape2, proto, chunk_bytes)

        return self._load(header, chunks, timeout, progress)

    def load_experts_on_server(self, experts_id: str, path: str, num_experts: int,
                               hidden_size: int, intermediate_size: int, *,
                               dtype: str = "bfloat16", activation: str = "silu",
                               w13: Optional[str] = None, w2: Optional[str] = None,
                               template: Optional[str] = None, timeout: Optional[float] = None,
                               progress: Optional[ProgressCallback] = None
                               ) -> service_pb2.ExpertsInfo:
        """LoadExperts from a safetensors file the server reads on its own host,
        under its --model_root (``path`` relative to the first root, or absolute
        under one; a ``model.safetensors.index.json`` for a sharded checkpoint):
        nothing is streamed from here. Tensors as in ``load_experts_safetensors``
        (stacked ``w13``/``w2``, or ``template`` with {e} and {proj}); ``dtype``
        is the file's: "bfloat16", "float16" or "float32". ``progress`` as in
        ``load_experts``: the bytes the server has read."""
        if dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be bfloat16, float16 or float32, got {dtype!r}")
        source = service_pb2.SafetensorsSource(path=os.fspath(path))
        if w13 is not None and w2 is not None:
            source.w13, source.w2 = w13, w2
        elif template is not None:
            if "{e}" not in template or "{proj}" not in template:
                raise ValueError("template needs {e} and {proj}")
            source.gate_proj = template.replace("{proj}", "gate_proj")
            source.up_proj = template.replace("{proj}", "up_proj")
            source.down_proj = template.replace("{proj}", "down_proj")
        else:
            raise ValueError("name the tensors: w13= and w2=, or template=")
        header = service_pb2.ExpertsHeader(
            experts_id=experts_id, num_experts=num_experts, hidden_size=hidden_size,
            intermediate_size=intermediate_size, activation=activation,
            dtype=_tensors.DTYPE_WORDS[dtype], safetensors=source)
        return self._load(header, lambda: iter(()), timeout, progress)

    def _load(self, header: service_pb2.ExpertsHeader,
              chunks: Callable[[], Iterator[service_pb2.TensorChunk]],
              timeout: Optional[float],
              progress: Optional[ProgressCallback] = None) -> service_pb2.ExpertsInfo:
        """LoadExperts; with ``progress``, a thread polls ListExperts every
        ``progress_interval`` seconds and calls it (on that thread) with the
        set while it is LOADING: ``info.progress`` has bytes_done, bytes_total,
        experts_done and experts_total, counted by the server."""
        self._match_server_limit()
        if timeout is None:
            timeout = max(self._timeout, load_timeout(header))

        def messages() -> Iterator[service_pb2.LoadExpertsRequest]:
            yield service_pb2.LoadExpertsRequest(header=header)
            for chunk in chunks():
                yield service_pb2.LoadExpertsRequest(chunk=chunk)

        if progress is None:
            return self._call(lambda s: s.LoadExperts, messages, timeout).experts
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(self.progress_interval):
                try:
                    listed = self._stub.ListExperts(service_pb2.ListExpertsRequest(),
                                                    timeout=max(5 * self.progress_interval, 1.0),
                                                    metadata=self._metadata)
                except grpc.RpcError:
                    continue  # a poll that fails is skipped
                for info in listed.experts:
                    if (info.experts_id == header.experts_id and
                            info.state == service_pb2.EXPERTS_STATE_LOADING):
                        progress(info)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            return self._call(lambda s: s.LoadExperts, messages, timeout).experts
        finally:
            stop.set()
            watcher.join()

    def unload_experts(self, experts_id: str) -> int:
        """UnloadExperts; returns the bytes freed."""
        req = service_pb2.UnloadExpertsRequest(experts_id=experts_id)
        return self._call(lambda s: s.UnloadExperts, lambda: req).bytes_freed

    def list_experts(self) -> List[service_pb2.ExpertsInfo]:
        """ListExperts: the resident sets (``state`` READY) and the loads under
        way (LOADING, with ``progress``)."""
        return list(self._call(lambda s: s.ListExperts, service_pb2.ListExpertsRequest).experts)

    # --- shared memory -----------------------------------------------------------

    def register_shared_memory(self, name: str, key: str, byte_size: int,
                               offset: int = 0, *, cuda_ipc_handle: bytes = b"",
                               device_id: int = 0) -> None:
        """RegisterSharedMemory: the window [offset, offset + byte_size) of the
        POSIX object `key` ("/kplan..."), as region `name`; or, with key ""
        and offset 0, the first byte_size bytes of the CUDA allocation whose
        cudaIpcGetMemHandle is `cuda_ipc_handle`, on GPU `device_id`."""
        region = service_pb2.SharedMemoryRegion(name=name, key=key, offset=offset,
                                                byte_size=byte_size,
                                                cuda_ipc_handle=cuda_ipc_handle,
                                                device_id=device_id)
        req = service_pb2.RegisterSharedMemoryRequest(region=region)
        self._call(lambda s: s.RegisterSharedMemory, lambda: req)

    def unregister_shared_memory(self, name: str) -> None:
        req = service_pb2.UnregisterSharedMemoryRequest(name=name)
        self._call(lambda s: s.UnregisterSharedMemory, lambda: req)

    def list_shared_memory(self) -> List[service_pb2.SharedMemoryRegion]:
        return list(self._call(lambda s: s.ListSharedMemory,
                               service_pb2.ListSharedMemoryRequest).regions)

    def shared_memory(self, byte_size: int, mode: int = 0o600) -> shm.SharedMemoryRegion:
        """A new POSIX region of `byte_size` bytes registered with this server
        (kplan.shm): numpy views into it go to run_moe by reference. `mode`:
        0o660 for a server of another user in the object's group (sidecar)."""
        return shm.SharedMemoryRegion(self, byte_size, mode)

    def open_shm_channel(self, region: str, request_capacity: int) -> int:
        """OpenShmChannel on registered POSIX region `region`; returns the
        answer area's bytes (``shm_channel`` does all of it)."""
        req = service_pb2.OpenShmChannelRequest(region=region,
                                                request_capacity=request_capacity)
        return self._call(lambda s: s.OpenShmChannel, lambda: req).response_capacity

    def close_shm_channel(self, region: str) -> None:
        req = service_pb2.CloseShmChannelRequest(region=region)
        self._call(lambda s: s.CloseShmChannel, lambda: req)

    def shm_channel(self, request_capacity: int = 1 << 20, response_capacity: int = 1 << 20,
                    spin: float = 50e-6, mode: int = 0o600,
                    in_region_from: int = 1 << 20) -> shm_channel.ShmChannel:
        """A shared-memory call channel with this server (kplan.shm_channel):
        ``run_moe(..., channel=ch)`` then goes through it, without gRPC.
        Hidden states of ``in_region_from`` bytes or more travel in the
        channel's region by reference when they fit its areas (by default
        from 1 MiB; 0: always; negative: never); such a call past the
        server's call-time cap fails CANCELLED instead of being answered."""
        return shm_channel.ShmChannel(self, request_capacity, response_capacity, spin, mode,
                                      in_region_from)

    def register_cuda_memory(self, handle: bytes, byte_size: int, device_id: int = 0,
                             name: Optional[str] = None) -> cuda_ipc.CudaMemoryRegion:
        """Registers `byte_size` bytes of this process's CUDA allocation
        `handle` (cudaIpcGetMemHandle's 64 bytes) on GPU `device_id` as
        region `name` (default: a new one); references from its ``tensor``
        go to run_moe like POSIX ones (kplan.cuda_ipc)."""
        return cuda_ipc.CudaMemoryRegion(self, handle, byte_size, device_id, name)

    # --- execution ---------------------------------------------------------------

    @overload
    def run_moe(self, experts_id: str, hidden_states: npt.ArrayLike,
                router_logits: Optional[npt.ArrayLike] = ..., top_k: int = ...,
                routing_method: str = ..., topk_ids: Optional[npt.ArrayLike] = ...,
                topk_weights: Optional[npt.ArrayLike] = ..., dtype: Optional[str] = ...,
                moe_backend: str = ..., return_plan: "Literal[False]" = ...,
                all2all_backend: str = ..., timeout: Optional[float] = ...,
                output: Optional[shm.ShmTensor] = ...,
                channel: Optional[shm_channel.ShmChannel] = ...) -> npt.NDArray: ...

    @overload
    def run_moe(self, experts_id: str, hidden_states: npt.ArrayLike,
                router_logits: Optional[npt.ArrayLike] = ..., top_k: int = ...,
                routing_method: str = ..., topk_ids: Optional[npt.ArrayLike] = ...,
                topk_weights: Optional[npt.ArrayLike] = ..., dtype: Optional[str] = ...,
                moe_backend: str = ..., *, return_plan: "Literal[True]",
                all2all_backend: str = ..., timeout: Optional[float] = ...,
                output: Optional[shm.ShmTensor] = ...,
                channel: Optional[shm_channel.ShmChannel] = ...
                ) -> Tuple[npt.NDArray, service_pb2.RunMoEResponse]: ...

    # An output in CUDA memory (kplan.cuda_ipc) comes back as its reference.
    @overload
    def run_moe(self, experts_id: str, hidden_states: Any, *args: Any,
                output: cuda_ipc.CudaTensor, return_plan: "Literal[False]" = ...,
                **kwargs: Any) -> cuda_ipc.CudaTensor: ...

    @overload
    def run_moe(self, experts_id: str, hidden_states: Any, *args: Any,
                output: cuda_ipc.CudaTensor, return_plan: "Literal[True]", **kwargs: Any
                ) -> Tuple[cuda_ipc.CudaTensor, service_pb2.RunMoEResponse]: ...

    def run_moe(self, experts_id, hidden_states, router_logits=None, top_k=2,
                routing_method="RenormalizeNaive", topk_ids=None, topk_weights=None,
                dtype=None, moe_backend="auto", return_plan=False, all2all_backend="",
                timeout=None, output=None, channel=None):
        """RunMoE: hidden_states [M, H] (float32/float16; ``dtype="bfloat16"`` sends
        float32 rounded to bfloat16) with router_logits [M, E] and routing, or
        topk_ids/topk_weights [M, k]. ``all2all_backend`` picks the dispatch on a
        server with an expert-parallel group. Returns the output as a writable
        numpy array (float32 for bfloat16), or (output, response) with
        ``return_plan``: response.plan says what ran (backend, experts_kernel,
        devices), response.timing how long and whether the call shared a
        coalesced launch (timing.coalesced_requests). Any input may be a kplan.shm.ShmTensor (sent by
        reference), and ``output`` one too: the server writes the output there
        and its view is returned. Or kplan.cuda_ipc.CudaTensor references (CUDA
        memory): an ``output`` there is returned as itself, not an array.
        ``channel`` (``shm_channel()``) sends the call through shared memory
        instead of gRPC; errors are the same."""
        def arg(value: Any, np_dtype: Any = None, wire: Optional[str] = None) -> Any:
            if isinstance(value, shm.RegionTensor):
                return value.message()
            return _tensors.tensor(np.asarray(value, np_dtype) if np_dtype else value, wire)

        req = service_pb2.RunMoERequest(experts_id=experts_id)
        req.hidden_states.CopyFrom(arg(hidden_states, wire=dtype))
        if output is not None:
            req.output_shm.CopyFrom(output.ref())
        req.kernel_config.moe_backend = moe_backend
        if all2all_backend:
            req.parallel.all2all_backend = all2all_backend
        if router_logits is not None:
            req.router_logits.CopyFrom(arg(router_logits, np.float32))
            req.routing.top_k = top_k
            req.routing.routing_method = routing_method
        else:
            if topk_ids is None or topk_weights is None:
                raise ValueError("give router_logits, or topk_ids and topk_weights")
            req.topk_ids.CopyFrom(arg(topk_ids, np.int32))
            req.topk_weights.CopyFrom(arg(topk_weights, np.float32))
        if channel is not None:
            resp = channel.call(req, timeout if timeout is not None else self._timeout)
        else:
            self._match_server_limit()
            resp = self._call(lambda s: s.RunMoE, lambda: req, timeout)
        out = output.output_value() if output is not None else _tensors.decode(resp.output)
        return (out, resp) if return_plan else out

    def run_ir_op(self, op: str, inputs: Mapping[str, Optional[npt.ArrayLike]], *,
                  epsilon: Optional[float] = None, variance_size: Optional[int] = None,
                  std_multiplier: Optional[float] = None,
                  approximate: Optional[str] = None, priority: Sequence[str] = (),
                  device: str = "", dtype: Optional[str] = None,
                  timeout: Optional[float] = None) -> Dict[str, npt.NDArray]:
        """RunIrOp: one vLLM IR op ("rms_norm", "fused_add_rms_norm",
        "gelu_and_mul_sparse") on named inputs (x, x_residual, weight; None: an
        absent weight). Returns the named outputs ("out", "residual") as writable
        arrays; the response's provider is in ``last_ir_provider``.
        gelu_and_mul_sparse takes vLLM's ``std_multiplier``, the standard
        normal quantile of the layer's activation sparsity
        (``statistics.NormalDist().inv_cdf(0.95)`` for Gemma3n's 0.95)."""
        req = service_pb2.RunIrOpRequest(op=op, priority=list(priority), device=device)
        for name, array in inputs.items():
            if array is not None:
                req.inputs.add(name=name, tensor=_tensors.tensor(array, dtype))
        if epsilon is not None:
            req.epsilon = epsilon
        if variance_size is not None:
            req.variance_size = variance_size
        if std_multiplier is not None:
            req.std_multiplier = std_multiplier
        if approximate is not None:
            req.approximate = approximate
        self._match_server_limit()
        resp = self._call(lambda s: s.RunIrOp, lambda: req, timeout)
        self.last_ir_provider = resp.provider
        return {t.name: _tensors.decode(t.tensor) for t in resp.outputs}


def load_timeout(header: service_pb2.ExpertsHeader) -> float:
    """A load's default deadline in seconds, as the CLI's: 60 s plus 1 s per
    100 MB of weights (a server reading a file at 100 MB/s). The Client's
    ``timeout`` is used when it is longer, a load's ``timeout=`` always."""
    itemsize = 4 if header.dtype == config_pb2.DTYPE_FLOAT32 else 2
    matrices = 2 if header.activation.endswith("_no_mul") else 3
    weights = header.num_experts * header.hidden_size * header.intermediate_size * matrices
    return 60.0 + weights * itemsize // 100_000_000


def parse_platform(spec: str) -> config_pb2.Platform:
    """Parses "cuda:9.0[+lib,lib]", "rocm:gfx950", "cpu" into a Platform message."""
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
