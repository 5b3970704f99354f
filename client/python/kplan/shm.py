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
makes them from float32."""

from __future__ import annotations

import itertools
import os
from multiprocessing import shared_memory
from typing import Any, Sequence

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


class ShmTensor:
    """A tensor in a registered region: ``array`` is the writable numpy view."""

    def __init__(self, region: "SharedMemoryRegion", offset: int, array: npt.NDArray,
                 dtype: int):
        self.region, self.offset, self.array, self.dtype = region, offset, array, dtype

    def ref(self) -> config_pb2.SharedMemoryRef:
        return config_pb2.SharedMemoryRef(region=self.region.name, offset=self.offset,
                                          byte_size=self.array.nbytes)

    def message(self) -> config_pb2.Tensor:
        """The Tensor message naming these bytes instead of carrying them."""
        return config_pb2.Tensor(dtype=self.dtype, shape=self.array.shape, shm=self.ref())


class SharedMemoryRegion:
    """A POSIX shared-memory object of `byte_size` bytes, registered with
    `client`'s server under its name (use ``Client.shared_memory``)."""

    def __init__(self, client: Any, byte_size: int):
        if byte_size <= 0:
            raise ValueError("a shared-memory region needs byte_size > 0")
        self._shm = shared_memory.SharedMemory(
            name=f"kplan-py-{os.getpid()}-{next(_counter)}", create=True, size=byte_size)
        self.name = self._shm.name.lstrip("/")
        self.key = "/" + self.name
        self.byte_size = byte_size
        self._next = 0
        self._client = None
        try:
            client.register_shared_memory(self.name, self.key, byte_size)
        except BaseException:
            self._release()
            raise
        self._client = client

    def array(self, shape: Sequence[int], dtype: str = "float32",
              offset: "int | None" = None) -> ShmTensor:
        """A view of `shape` and `dtype` (float32, float16, bfloat16, int32) at
        `offset`, or after the last view handed out (64-byte aligned)."""
        if dtype not in _DTYPES:
            raise ValueError(f"dtype {dtype!r}: use one of {sorted(_DTYPES)}")
        np_dtype, proto = _DTYPES[dtype]
        if offset is None:
            offset = -(-self._next // _ALIGN) * _ALIGN
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(np_dtype).itemsize
        if offset < 0 or offset + nbytes > self.byte_size:
            raise ValueError(f"[{offset}, {offset} + {nbytes}) is outside the region's "
                             f"{self.byte_size} bytes")
        self._next = max(self._next, offset + nbytes)
        view = np.ndarray(tuple(shape), np_dtype, buffer=self._shm.buf, offset=offset)
        return ShmTensor(self, offset, view, proto)

    def close(self) -> None:
        """Unregisters (the server may be gone: ignored), then unlinks the
        object; views still held keep their pages until they go."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client.unregister_shared_memory(self.name)
            except Exception:  # noqa: BLE001 - the region goes whatever the server says
                pass
        self._release()

    def _release(self) -> None:
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

    def __enter__(self) -> "SharedMemoryRegion":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_shm", None) is not None:
            self.close()
