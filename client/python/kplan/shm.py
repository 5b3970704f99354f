"""RunMoE tensors by reference through POSIX shared memory (Triton's system
shared-memory extension; the server runs with --allow_shared_memory on this
host). A SharedMemoryRegion creates a "/kplan-py-..." object
(multiprocessing.shared_memory), registers it with the server and hands out
numpy views into it (``array``); ``Client.run_moe`` takes those views for its
inputs and ``output``, sends {region, offset, byte_size} instead of bytes, and
returns the output view, which the server wrote. ``close`` (or leaving the
``with`` block) unregisters and unlinks the region.

    with client.shared_memory(1 << 20) as region:
        x = region.array((m, h), "float32")
        logits = region.array((m, e), "float32")
        out = region.array((m, h), "float32")
        x.array[:] = ...; logits.array[:] = ...
        y = client.run_moe("layer0", x, logits, top_k=2, output=out)  # y is out.array

bfloat16 views hold the bit patterns (uint16); ``_tensors.to_bfloat16_bits``
makes them from float32. Region and RegionTensor are what POSIX and CUDA
regions (kplan.cuda_ipc) share: placing tensors, the reference messages,
unregistering."""

from __future__ import annotations

import itertools
import math
import os
from multiprocessing import shared_memory
from typing import Any, Sequence, TypeVar

import numpy as np
import numpy.typing as npt

from kplan.v1 import config_pb2

_DTYPES = {
    "float32": ("<f4", config_pb2.DTYPE_FLOAT32),
    "float16": ("<f2", config_pb2.DTYPE_FLOAT16),
    "bfloat16": ("<u2", config_pb2.DTYPE_BFLOAT16),
    "int32": ("<i4", config_pb2.DTYPE_INT32),
}
_ALIGN = 64
_counter = itertools.count()
_R = TypeVar("_R", bound="Region")


def is_index(value: Any) -> bool:
    """An int (or numpy integer), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def set_mode(name: str, mode: int) -> None:
    """Sets POSIX shm object `name`'s permissions whatever the umask: 0o600
    (this user), or 0o660 for a server of another user in the object's group
    (the sidecar pod, whose containers share the pod's fsGroup)."""
    os.chmod(f"/dev/shm/{name}", mode)


class RegionTensor:
    """A tensor by reference: `shape` and `dtype` (a config_pb2 DType) at
    `offset` of registered `region`, sent to run_moe as {region, offset,
    byte_size} instead of its bytes. POSIX regions hand out ShmTensor, CUDA
    ones (kplan.cuda_ipc) CudaTensor."""

    def __init__(self, region: "Region", offset: int, shape: Sequence[int], dtype: int,
                 byte_size: int):
        self.region, self.offset, self.shape = region, offset, tuple(shape)
        self.dtype, self.byte_size = dtype, byte_size

    def ref(self) -> config_pb2.SharedMemoryRef:
        return config_pb2.SharedMemoryRef(region=self.region.name, offset=self.offset,
                                          byte_size=self.byte_size)

    def message(self) -> config_pb2.Tensor:
        """The Tensor message naming these bytes instead of carrying them."""
        return config_pb2.Tensor(dtype=self.dtype, shape=self.shape, shm=self.ref())

    def output_value(self) -> Any:
        """What run_moe returns for an output written here (``output=``)."""
        return self


class ShmTensor(RegionTensor):
    """A tensor in a POSIX region: ``array`` is the writable numpy view."""

    def __init__(self, region: "SharedMemoryRegion", offset: int, array: npt.NDArray,
                 dtype: int):
        super().__init__(region, offset, array.shape, dtype, array.nbytes)
        self.array = array

    def output_value(self) -> npt.NDArray:
        return self.array


class Region:
    """A registered region of `byte_size` bytes (POSIX or CUDA memory): places
    tensors in it, unregisters at ``close`` or the end of a ``with`` block."""

    name: str

    def __init__(self, byte_size: int):
        if not is_index(byte_size) or byte_size <= 0:
            raise ValueError(f"byte_size {byte_size!r}: a region needs an int > 0")
        self.byte_size = int(byte_size)
        self._next = 0
        self._client: Any = None

    def _place(self, shape: Sequence[int], dtype: str,
               offset: "int | None") -> "tuple[int, int, str, int]":
        """(offset, byte_size, numpy dtype, DType) of `shape` x `dtype` at
        `offset`, or after the last tensor placed (64-byte aligned); checks
        all three against the region."""
        if dtype not in _DTYPES:
            raise ValueError(f"dtype {dtype!r}: use one of {sorted(_DTYPES)}")
        np_dtype, proto = _DTYPES[dtype]
        dims = tuple(shape)
        if not all(is_index(d) and d >= 0 for d in dims):
            raise ValueError(f"shape {dims!r}: dimensions must be ints >= 0")
        if offset is None:
            offset = -(-self._next // _ALIGN) * _ALIGN
        elif not is_index(offset) or offset < 0:
            raise ValueError(f"offset {offset!r}: must be an int >= 0")
        nbytes = math.prod(int(d) for d in dims) * np.dtype(np_dtype).itemsize  # no wrap
        if offset + nbytes > self.byte_size:
            raise ValueError(f"offset {offset} + shape {dims} {dtype} ({nbytes} bytes) is "
                             f"outside the region's {self.byte_size} bytes")
        self._next = max(self._next, offset + nbytes)
        return int(offset), nbytes, np_dtype, proto

    def close(self) -> None:
        """Unregisters (the server may be gone: ignored), then lets go of the
        memory (``_release``). Again: nothing."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client.unregister_shared_memory(self.name)
            except Exception:  # noqa: BLE001 - the region goes whatever the server says
                pass
        self._release()

    def _release(self) -> None:
        pass

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_client", None) is not None:
            self.close()


class SharedMemoryRegion(Region):
    """A POSIX shared-memory object of `byte_size` bytes, registered with
    `client`'s server under its name (use ``Client.shared_memory``)."""

    def __init__(self, client: Any, byte_size: int, mode: int = 0o600):
        super().__init__(byte_size)
        self._shm: Any = shared_memory.SharedMemory(
            name=f"kplan-py-{os.getpid()}-{next(_counter)}", create=True, size=byte_size)
        self.name = self._shm.name.lstrip("/")
        self.key = "/" + self.name
        try:
            set_mode(self.name, mode)
            client.register_shared_memory(self.name, self.key, byte_size)
        except BaseException:
            self._release()
            raise
        self._client = client

    @property
    def buffer(self) -> memoryview:
        """The whole region's bytes (a call channel's layout: kplan.shm_channel)."""
        return self._shm.buf

    def array(self, shape: Sequence[int], dtype: str = "float32",
              offset: "int | None" = None) -> ShmTensor:
        """A view of `shape` and `dtype` (float32, float16, bfloat16, int32) at
        `offset`, or after the last view handed out (64-byte aligned)."""
        offset, _, np_dtype, proto = self._place(shape, dtype, offset)
        view = np.ndarray(tuple(shape), np_dtype, buffer=self._shm.buf, offset=offset)
        return ShmTensor(self, offset, view, proto)

    def _release(self) -> None:
        """Unlinks the object; views still held keep their pages until they go."""
        if self._shm is None:
            return
        shm, self._shm = self._shm, None
        try:
            shm.close()
        except BufferError:  # numpy views still use the mapping; it goes with them
            pass
        try:
            shm.unlink()
        except FileNotFoundError:
            pass
