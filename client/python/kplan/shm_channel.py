"""RunMoE through a shared-memory call channel (the layout and protocol:
base/shm_channel.h in the kplan source; the server runs with
--allow_shared_memory on this host). A call writes the serialized request
into a POSIX region the server serves, flips a state word and waits for the
answer there: no gRPC on the call's path. Open one with
``Client.shm_channel()`` and pass it to ``run_moe``; one call at a time (a
channel per thread):

    with client.shm_channel() as ch:
        y = client.run_moe("layer0", x, logits, top_k=8, channel=ch)

Inputs and ``output`` may still be kplan.shm references, so a large call
moves no tensor bytes through the channel. Waiting polls for ``spin``
seconds, then sleeps on the word's futex (Linux x86-64 and aarch64); the
state word moves by compare-and-swap through libatomic."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import struct
import time
from typing import Any, Optional

import grpc

from google.protobuf.message import DecodeError

from kplan import shm
from kplan.errors import KplanError, field_of_status, status_pb2
from kplan.v1 import service_pb2

_MAGIC, _VERSION = 0x4843504B, 1
_HEADER = 64
_MIN_RESPONSE = 4096
# State word values (ShmChannelState).
_IDLE, _POSTED, _RUNNING, _DONE, _CANCELLED, _CLOSED = range(6)
# Header fields: (struct format, offset).
_STATE, _STATUS, _REQ_BYTES, _RESP_BYTES = ("<I", 8), ("<i", 12), ("<Q", 16), ("<Q", 24)
_TIMEOUT, _SEQ, _RESP_SEQ = ("<q", 32), ("<Q", 40), ("<Q", 48)
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True)
# The state word's compare-and-swap and ordered loads and stores: GCC's
# libatomic (libatomic1), as C++'s std::atomic does them. Without it (rare),
# plain accesses: ordered on x86-64 (TSO), but a move of the client's may
# then overwrite one of the server's (a channel closing meanwhile is then
# seen at the call's deadline instead of at once).
_SEQ_CST = 5
_atomic_load = _atomic_cas = None
try:
    _libatomic = ctypes.CDLL(ctypes.util.find_library("atomic") or "libatomic.so.1")
    # getattr: names with two leading underscores would be mangled in a class.
    _atomic_load = getattr(_libatomic, "__atomic_load_4")
    _atomic_load.restype = ctypes.c_uint32
    _atomic_load.argtypes = [ctypes.c_void_p, ctypes.c_int]
    _atomic_cas = getattr(_libatomic, "__atomic_compare_exchange_4")
    _atomic_cas.restype = ctypes.c_bool
    _atomic_cas.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32,
                            ctypes.c_int, ctypes.c_int]
except (OSError, AttributeError):
    _atomic_load = _atomic_cas = None


def _copy_field(dst: Any, field: Any, value: Any) -> None:
    """Sets field `field` of message dst to `value` (as ListFields gives them)."""
    if field.label == field.LABEL_REPEATED:
        getattr(dst, field.name).extend(value)
    elif field.message_type is not None:
        getattr(dst, field.name).CopyFrom(value)
    else:
        setattr(dst, field.name, value)


class ShmChannel:
    """A channel in a new POSIX region of `request_capacity` + `response_capacity`
    bytes after a 64-byte header (a kplan.shm.SharedMemoryRegion, `mode` its
    object's permissions), opened with `client`'s server (use
    ``Client.shm_channel``). ``close`` (or leaving the ``with`` block) closes it,
    then unregisters and unlinks the region."""

    def __init__(self, client: Any, request_capacity: int = 1 << 20,
                 response_capacity: int = 1 << 20, spin: float = 50e-6, mode: int = 0o600,
                 in_region_from: int = 1 << 20):
        if request_capacity <= 0 or response_capacity < _MIN_RESPONSE:
            raise ValueError(f"request_capacity must be > 0 and response_capacity >= "
                             f"{_MIN_RESPONSE}; got {request_capacity}, {response_capacity}")
        self.request_capacity, self.response_capacity = request_capacity, response_capacity
        self.spin = spin
        # At or past this many bytes of inline hidden states (1 MiB by
        # default), they, inline logits and the output go into the request
        # area's tail as references into this region, if they fit: the
        # server reads and writes them in place. The caller still gets the
        # output's bytes inline. 0: every call; negative: never. A placed
        # call past the server's call-time cap fails CANCELLED (naming
        # output_shm) where a serialized one is answered. As the C++
        # ShmChannel::Options::in_region_from_bytes.
        self.in_region_from = in_region_from
        self._client: Any = None
        self._sequence = 0
        # The region (kplan.shm) creates, registers, unregisters and unlinks
        # the object, as ClientShmRegion does for the C++ channel.
        self._region: Any = shm.SharedMemoryRegion(
            client, _HEADER + request_capacity + response_capacity, mode)
        self.name = self._region.name
        self._buf = self._region.buffer
        struct.pack_into("<III", self._buf, 0, _MAGIC, _VERSION, _IDLE)
        self._word = ctypes.c_uint32.from_buffer(self._buf, _STATE[1])
        self._word_at = ctypes.addressof(self._word)
        try:
            client.open_shm_channel(self.name, request_capacity)
        except BaseException:
            self.close()
            raise
        self._client = client

    # --- the protocol (base/shm_channel.h) -----------------------------------

    def _load(self) -> int:
        if _atomic_load is not None:
            return int(_atomic_load(self._word_at, _SEQ_CST))
        return int(self._word.value)

    def _cas(self, expected: int, desired: int) -> "tuple[bool, int]":
        """Moves the word from `expected` to `desired`; (moved, the value seen)."""
        if _atomic_cas is not None:
            seen = ctypes.c_uint32(expected)
            moved = _atomic_cas(self._word_at, ctypes.byref(seen), desired, _SEQ_CST, _SEQ_CST)
            return bool(moved), int(seen.value)
        seen_value = int(self._word.value)
        if seen_value != expected:
            return False, seen_value
        self._word.value = desired
        return True, expected

    def _get(self, field: "tuple[str, int]") -> int:
        return struct.unpack_from(field[0], self._buf, field[1])[0]

    def _put(self, field: "tuple[str, int]", value: int) -> None:
        struct.pack_into(field[0], self._buf, field[1], value)

    def _futex(self, op: int, value: int, timeout: Optional[float]) -> None:
        if _SYS_FUTEX is None:  # another architecture: poll
            time.sleep(min(timeout or 0.0, 1e-4))
            return
        ts = None
        if timeout is not None:
            ts = _Timespec(int(timeout), int((timeout % 1) * 1e9))
        _libc.syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(self._word_at),
                      ctypes.c_int(op), ctypes.c_uint32(value),
                      ctypes.byref(ts) if ts is not None else None, None, ctypes.c_int(0))

    def _await_change(self, value: int, deadline: float) -> int:
        """The state word once it no longer holds `value`, or at `deadline`."""
        spin_end = min(time.monotonic() + self.spin, deadline)
        while True:
            now_value = self._load()
            if now_value != value:
                return now_value
            now = time.monotonic()
            if now >= deadline:
                return now_value
            if now >= spin_end:
                self._futex(_FUTEX_WAIT, value, min(deadline - now, 0.02))

    def call(self, request: service_pb2.RunMoERequest,
             timeout: float) -> service_pb2.RunMoEResponse:
        """One RunMoE; raises kplan.KplanError as a gRPC call would (the
        server's code, message and field)."""
        if self._client is None:
            raise KplanError(grpc.StatusCode.UNAVAILABLE, "the channel is closed", None)
        deadline = time.monotonic() + timeout
        state = self._load()
        # An abandoned call holds the channel until the server lets go of it.
        while state not in (_IDLE, _DONE):
            if state == _CLOSED:
                raise KplanError(grpc.StatusCode.UNAVAILABLE, _CLOSED_TEXT, None)
            if state in (_POSTED, _RUNNING):
                _, state = self._cas(state, _CANCELLED)
                continue
            if state > _CLOSED:  # not the protocol's: this process wrote over it
                _, state = self._cas(state, _IDLE)
                continue
            new = self._await_change(state, deadline)
            if new == state:
                raise KplanError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 "the shared-memory channel is still held by an abandoned call",
                                 None)
            state = new
        placed = self._place(request)
        data = (placed[0] if placed else request).SerializeToString()
        if len(data) > self.request_capacity:
            raise KplanError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"the request's {len(data)} bytes exceed the channel's request "
                             f"capacity of {self.request_capacity} bytes", "request")
        self._buf[_HEADER:_HEADER + len(data)] = data
        self._sequence += 1
        self._put(_REQ_BYTES, len(data))
        self._put(_TIMEOUT, max(1, int((deadline - time.monotonic()) * 1e6)))
        self._put(_SEQ, self._sequence)
        moved, state = self._cas(state, _POSTED)
        if not moved:
            raise KplanError(grpc.StatusCode.UNAVAILABLE if state == _CLOSED
                             else grpc.StatusCode.INTERNAL,
                             _CLOSED_TEXT if state == _CLOSED else
                             f"the channel's state moved to {state} under the client", None)
        self._futex(_FUTEX_WAKE, 0x7FFFFFFF, None)
        state = _POSTED
        while state in (_POSTED, _RUNNING):
            new = self._await_change(state, deadline)
            if new == state:
                moved, new = self._cas(state, _CANCELLED)
                if moved:  # the server answers nothing now
                    raise KplanError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                     f"no answer on the shared-memory channel within {timeout} s",
                                     None)
            state = new
        # Closed right after Done still holds this call's answer.
        ours = self._get(_RESP_SEQ) == self._sequence
        if state == _CLOSED and not ours:
            raise KplanError(grpc.StatusCode.UNAVAILABLE, _CLOSED_TEXT, None)
        if state not in (_DONE, _CLOSED) or not ours:
            raise KplanError(grpc.StatusCode.INTERNAL,
                             f"the channel's state moved to {state} without an answer", None)
        n = self._get(_RESP_BYTES)
        if n > self.response_capacity:
            raise KplanError(grpc.StatusCode.INTERNAL, "the answer overruns its area", None)
        start = _HEADER + self.request_capacity
        answer = bytes(self._buf[start:start + n])
        code = self._get(_STATUS)
        try:
            if code == 0:
                response = service_pb2.RunMoEResponse.FromString(answer)
                if placed and response.output.HasField("shm"):  # as the caller asked: inline
                    at, n = _HEADER + placed[1], placed[2]
                    response.output.ClearField("shm")
                    response.output.data = bytes(self._buf[at:at + n])
                return response
            error = status_pb2.Status.FromString(answer)
        except DecodeError:
            raise KplanError(grpc.StatusCode.INTERNAL,
                             "the channel's answer could not be parsed", None) from None
        raise KplanError(_CODES.get(code, grpc.StatusCode.UNKNOWN), error.message,
                         field_of_status(error))

    def _place(self, request: service_pb2.RunMoERequest
               ) -> "Optional[tuple[service_pb2.RunMoERequest, int, int]]":
        """Large inline tensors into the request area's tail, from its end
        down (output, logits, hidden states; 64-byte aligned): the request
        that names them and the output's (offset in the area, bytes); None
        when the call goes serialized."""
        hidden, logits = request.hidden_states, request.router_logits
        n = len(hidden.data)
        if (self.in_region_from < 0 or n == 0 or n < self.in_region_from
                or hidden.HasField("shm") or request.HasField("output_shm")):
            return None
        logits_placed = len(logits.data) > 0 and not logits.HasField("shm")
        out_at = (self.request_capacity - n) & ~63
        below = out_at
        if logits_placed:
            below = logits_at = (below - len(logits.data)) & ~63
        hidden_at = (below - n) & ~63
        if hidden_at <= 0:
            return None
        # Every field but the placed tensors' bytes and shm (the bytes not
        # copied only to be cleared).
        placed = {"hidden_states"} | ({"router_logits"} if logits_placed else set())
        envelope = service_pb2.RunMoERequest()
        for field, value in request.ListFields():
            if field.name not in placed:
                _copy_field(envelope, field, value)
                continue
            tensor = getattr(envelope, field.name)
            for sub, sub_value in value.ListFields():
                if sub.name not in ("data", "shm"):
                    _copy_field(tensor, sub, sub_value)

        def refer(ref: Any, at: int, size: int) -> None:
            ref.region, ref.offset, ref.byte_size = self.name, _HEADER + at, size

        refer(envelope.hidden_states.shm, hidden_at, n)
        if logits_placed:
            refer(envelope.router_logits.shm, logits_at, len(logits.data))
        refer(envelope.output_shm, out_at, n)
        if envelope.ByteSize() > hidden_at:
            return None
        self._buf[_HEADER + hidden_at:_HEADER + hidden_at + n] = hidden.data
        if logits_placed:
            self._buf[_HEADER + logits_at:_HEADER + logits_at + len(logits.data)] = logits.data
        return envelope, out_at, n

    # --- lifetime --------------------------------------------------------------

    def close(self) -> None:
        """Closes the channel (the server may be gone: ignored), then its
        region. Again: nothing."""
        client, self._client = self._client, None
        if client is not None and self._load() != _CLOSED:
            try:
                client.close_shm_channel(self.name)
            except Exception:  # noqa: BLE001 - the region goes whatever the server says
                pass
        region, self._region = getattr(self, "_region", None), None
        if region is not None:
            self._word = None  # the buffer's last export: the mapping may go
            self._word_at = 0
            self._buf = None
            region.close()

    def __enter__(self) -> "ShmChannel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_region", None) is not None:
            self.close()


_CLOSED_TEXT = ("the server closed the shared-memory channel (close_shm_channel, its region "
                "unregistered, or the server stopping)")
# gRPC's numeric codes.
_CODES = {c.value[0]: c for c in grpc.StatusCode}
