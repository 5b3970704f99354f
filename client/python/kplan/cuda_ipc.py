"""RunMoE tensors by reference in this process's CUDA memory (Triton's CUDA
shared-memory extension; a server with a GPU on this host, started with
--allow_shared_memory). ``Client.register_cuda_memory`` registers one CUDA
allocation by its cudaIpcGetMemHandle bytes; the server opens it once
(cudaIpcOpenMemHandle), and ``region.tensor(shape, dtype, offset=)`` hands
out references into it, which ``Client.run_moe`` takes for its inputs and
``output``. The server reads and writes them on that GPU, device to device.
numpy cannot view device memory: ``run_moe(..., output=t)`` returns ``t``
itself (read the output with the library that owns the memory).

    h, size, device, base = kplan.cuda_ipc.handle_of_torch(buffer)  # a torch uint8 buffer
    with client.register_cuda_memory(h, size, device) as region:
        x = region.tensor((m, hidden), "bfloat16", offset=base)
        logits = region.tensor((m, e), "float32", offset=base + x.byte_size)
        out = region.tensor((m, hidden), "bfloat16", offset=base + x.byte_size + logits.byte_size)
        torch.cuda.synchronize()            # the server reads on its own stream
        client.run_moe("layer0", x, logits, top_k=2, output=out)  # returns out

One region per allocation (the server refuses a second registration of an
open handle: ALREADY_EXISTS); the server copies at any offset, so offsets
need no alignment. Keep the memory allocated until the region is
unregistered (``close``, the end of the ``with`` block, or ``unregister``).
A server without a GPU refuses a CUDA region (FAILED_PRECONDITION naming
region.cuda_ipc_handle)."""

from __future__ import annotations

import itertools
import os
from typing import Any, Optional, Sequence, Tuple

import grpc

from kplan import shm
from kplan.errors import KplanError

# sizeof(cudaIpcMemHandle_t).
HANDLE_BYTES = 64
_counter = itertools.count()


class CudaTensor(shm.RegionTensor):
    """A tensor in a CUDA region (``CudaMemoryRegion.tensor``): a reference
    only, no array."""


class CudaMemoryRegion(shm.Region):
    """`byte_size` bytes from the start of the CUDA allocation `handle` names
    on GPU `device_id`, registered with `client`'s server as `name` (use
    ``Client.register_cuda_memory``). Checks its arguments before any call."""

    def __init__(self, client: Any, handle: bytes, byte_size: int, device_id: int = 0,
                 name: Optional[str] = None):
        if not isinstance(handle, (bytes, bytearray, memoryview)):
            raise ValueError(f"handle: the {HANDLE_BYTES} bytes of cudaIpcGetMemHandle, "
                             f"got {type(handle).__name__}")
        handle = bytes(handle)
        if len(handle) != HANDLE_BYTES:
            raise ValueError(f"handle: a CUDA IPC handle has {HANDLE_BYTES} bytes "
                             f"(cudaIpcGetMemHandle), got {len(handle)} (torch's _share_cuda_ "
                             "handle: kplan.cuda_ipc.handle_of_torch)")
        super().__init__(byte_size)
        if not shm.is_index(device_id) or device_id < 0:
            raise ValueError(f"device_id {device_id!r}: a GPU index >= 0")
        if name is None:
            name = f"kplan-py-cuda-{os.getpid()}-{next(_counter)}"
        if not isinstance(name, str) or not name:
            raise ValueError(f"name {name!r}: a region needs a non-empty name")
        self.name, self.handle, self.device_id = name, handle, int(device_id)
        client.register_shared_memory(name, "", self.byte_size, cuda_ipc_handle=handle,
                                      device_id=self.device_id)
        self._client = client

    def tensor(self, shape: Sequence[int], dtype: str = "float32",
               offset: Optional[int] = None) -> CudaTensor:
        """The reference to `shape` x `dtype` (float32, float16, bfloat16,
        int32) at byte `offset` of the region (None: after the last tensor
        placed, 64-byte aligned), in the order of SharedMemoryRegion.array;
        ValueError naming the argument that does not fit."""
        offset, nbytes, _, proto = self._place(shape, dtype, offset)
        return CudaTensor(self, offset, shape, proto, nbytes)

    def unregister(self) -> None:
        """UnregisterSharedMemory, raising the server's error (KplanError).
        Once it succeeded or the server says NOT_FOUND the region is gone
        (later calls and ``close`` do nothing); after any other error it is
        kept, so that ``unregister`` or ``close`` (which ignores errors) can
        try again."""
        if self._client is None:
            return
        try:
            self._client.unregister_shared_memory(self.name)
        except KplanError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                self._client = None
            raise
        self._client = None


def handle_of_torch(tensor: Any) -> Tuple[bytes, int, int, int]:
    """(handle, byte_size, device, offset) of a contiguous torch CUDA tensor,
    for ``Client.register_cuda_memory(handle, byte_size, device)`` and
    ``region.tensor(..., offset=offset)``: the cudaIpcMemHandle of the allocation
    under its storage (torch's caching allocator shares its whole cudaMalloc
    segment), the bytes from that allocation's start through the end of the
    storage, and the byte offset of the tensor's first element in it.
    Tensors in one segment share a handle: register it once and address them
    by offset. Call it once per allocation and keep the result: every call
    makes torch record another IPC share of the storage, freed only with it.
    `device` is this process's CUDA index; the server's device_id may differ
    (its own numbering, CUDA_VISIBLE_DEVICES). Needs torch (imported here, not with kplan) and the allocator
    without expandable_segments (whose handles are no cudaIpcMemHandle)."""
    try:
        import torch
    except ImportError as e:
        raise RuntimeError("kplan.cuda_ipc.handle_of_torch needs torch, which is not "
                           "installed") from e
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        raise ValueError(f"tensor: a torch CUDA tensor is needed, got {type(tensor).__name__}"
                         + (f" on {tensor.device}" if isinstance(tensor, torch.Tensor) else ""))
    if not tensor.is_contiguous():
        raise ValueError("tensor: must be contiguous (its bytes one range of the allocation)")
    storage = tensor.untyped_storage()
    # torch 2.x: (device, handle, storage bytes, storage offset in the
    # allocation, ref-counter file, its offset, event handle, event needed).
    device, raw, storage_bytes, storage_offset, counter, counter_offset = (
        storage._share_cuda_()[:6])
    if raw is None:
        raise ValueError("tensor: its storage is empty (no allocation to share)")
    # The counter expects a torch consumer to decrement it; without this the
    # storage's block would never return to torch's cache once freed.
    torch.UntypedStorage._release_ipc_counter_cuda(counter, counter_offset)
    return (_cuda_ipc_handle(raw), storage_offset + storage_bytes, device,
            storage_offset + tensor.storage_offset() * tensor.element_size())


def _cuda_ipc_handle(raw: bytes) -> bytes:
    """The cudaIpcMemHandle in a torch storage handle: the 64 bytes alone
    (older torch), or a version byte, b"c" (a cudaMalloc segment) and
    the 64 bytes; b"e" (an expandable segment) is no cudaIpcMemHandle."""
    if len(raw) == HANDLE_BYTES:
        return raw
    if len(raw) == HANDLE_BYTES + 2 and raw[1:2] == b"c":
        return raw[2:]
    if len(raw) >= 2 and raw[1:2] == b"e":
        raise ValueError("tensor: allocated in an expandable segment, which CUDA IPC cannot "
                         "share by cudaIpcMemHandle; set PYTORCH_CUDA_ALLOC_CONF="
                         "expandable_segments:False")
    raise ValueError(f"tensor: torch's storage handle has {len(raw)} bytes in a layout this "
                     "client does not know")
