"""numpy arrays <-> kplan.v1.Tensor: raw little-endian bytes and a DType."""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import numpy.typing as npt

from kplan.v1 import config_pb2

# numpy dtype (little-endian) of each plain DType; bfloat16 travels as uint16.
_NUMPY = {
    config_pb2.DTYPE_FLOAT32: "<f4",
    config_pb2.DTYPE_FLOAT16: "<f2",
    config_pb2.DTYPE_INT32: "<i4",
    config_pb2.DTYPE_INT64: "<i8",
    config_pb2.DTYPE_INT8: "i1",
    config_pb2.DTYPE_UINT8: "u1",
}
_FROM_NUMPY = {np.dtype(v).newbyteorder("<").str: k for k, v in _NUMPY.items()}

# The words the CLI and the server's tables use, for each DType.
DTYPE_WORDS = {
    "float32": config_pb2.DTYPE_FLOAT32,
    "float16": config_pb2.DTYPE_FLOAT16,
    "bfloat16": config_pb2.DTYPE_BFLOAT16,
    "int32": config_pb2.DTYPE_INT32,
}


def to_bfloat16_bits(array: npt.ArrayLike) -> "npt.NDArray[np.uint16]":
    """float32 values rounded to nearest even bfloat16, as their uint16 bit patterns."""
    u = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def encode(array: npt.ArrayLike, dtype: Optional[str] = None) -> Tuple[bytes, int]:
    """The raw bytes of `array` and its DType; ``dtype="bfloat16"`` rounds float32."""
    if dtype == "bfloat16":
        return to_bfloat16_bits(array).tobytes(), config_pb2.DTYPE_BFLOAT16
    a = np.asarray(array)
    key = a.dtype.newbyteorder("<").str if a.dtype.byteorder != "|" else a.dtype.str
    proto = _FROM_NUMPY.get(key)
    if proto is None:
        raise ValueError(f"unsupported dtype {a.dtype}; use float32, float16, int32 or "
                         "dtype='bfloat16'")
    return np.ascontiguousarray(a, dtype=_NUMPY[proto]).tobytes(), proto


def tensor(array: npt.ArrayLike, dtype: Optional[str] = None) -> config_pb2.Tensor:
    """A Tensor message of `array`."""
    a = np.asarray(array)
    data, proto = encode(a, dtype)
    return config_pb2.Tensor(dtype=proto, shape=a.shape, data=data)


def decode(t: config_pb2.Tensor) -> npt.NDArray:
    """A Tensor message as a writable numpy array (bfloat16 widened to float32)."""
    shape = tuple(t.shape)
    if t.dtype == config_pb2.DTYPE_BFLOAT16:
        bits = np.frombuffer(t.data, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    if t.dtype not in _NUMPY:
        raise ValueError(f"cannot decode {config_pb2.DType.Name(t.dtype)}")
    # frombuffer views the message's immutable bytes: copy into our own array.
    return np.frombuffer(t.data, dtype=_NUMPY[t.dtype]).reshape(shape).copy()
