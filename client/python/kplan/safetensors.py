"""A safetensors file read as LoadExperts chunks, a bounded piece at a time:
the header (JSON) is parsed, tensors are never read whole."""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Dict, Iterator, List, Sequence, Tuple

from kplan.v1 import config_pb2, service_pb2

_DTYPES = {
    "F32": (config_pb2.DTYPE_FLOAT32, 4),
    "F16": (config_pb2.DTYPE_FLOAT16, 2),
    "BF16": (config_pb2.DTYPE_BFLOAT16, 2),
}
_MAX_HEADER = 100 << 20  # the format's limit


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors' word: F32, F16, BF16, ...
    shape: Tuple[int, ...]
    begin: int  # absolute byte offsets in the file
    end: int


def read_header(path: "os.PathLike[str] | str") -> Dict[str, TensorInfo]:
    """The tensors a safetensors file holds, checked against its size."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            raise ValueError(f"{path}: header of {n} bytes does not fit the file")
        header = json.loads(f.read(n))
    base = 8 + n
    out: Dict[str, TensorInfo] = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        if not 0 <= begin <= end or base + end > size:
            raise ValueError(f"{path}: tensor {name!r} lies outside the file")
        out[name] = TensorInfo(name, t["dtype"], tuple(t["shape"]), base + begin, base + end)
    return out


def proto_dtype(t: TensorInfo) -> Tuple[int, int]:
    """The DType and element size of a tensor kplan can load."""
    if t.dtype not in _DTYPES:
        raise ValueError(f"tensor {t.name!r} is {t.dtype}; kplan loads F32, F16 and BF16")
    return _DTYPES[t.dtype]


def chunks(f: BinaryIO, name: str, parts: Sequence[TensorInfo], shape: Sequence[int],
           dtype: int, chunk_bytes: int) -> Iterator[service_pb2.TensorChunk]:
    """TensorChunks of tensor `name` made of `parts` laid end to end (per-expert
    tensors stacked over experts), each at most `chunk_bytes`, read as sent."""
    offset = 0
    for part in parts:
        at = part.begin
        while at < part.end:
            n = min(chunk_bytes, part.end - at)
            f.seek(at)
            data = f.read(n)
            if len(data) != n:
                raise ValueError(f"{f.name}: short read in tensor {part.name!r}")
            chunk = service_pb2.TensorChunk(name=name, offset=offset, data=data)
            if offset == 0:
                chunk.dtype = dtype
                chunk.shape.extend(shape)
            yield chunk
            offset += n
            at += n


def expert_names(template: str, proj: str, tensors: Dict[str, TensorInfo]) -> List[str]:
    """template with {proj} and {e}, for e = 0, 1, ... while the file has it."""
    names = []
    while True:
        name = template.replace("{proj}", proj).replace("{e}", str(len(names)))
        if name not in tensors:
            return names
        names.append(name)
