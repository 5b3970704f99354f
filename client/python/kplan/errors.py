"""kplan.KplanError and reading the field a server's status names. Every
module of the package that raises the server's errors takes them from here
(client, shm_channel, cuda_ipc), so none imports another for them."""

from __future__ import annotations

from typing import Optional

import grpc

try:  # googleapis-common-protos when installed, else ours (never both)
    from google.rpc import error_details_pb2, status_pb2
except ImportError:
    from kplan._vendor.google_rpc import error_details_pb2, status_pb2

__all__ = ["KplanError", "field_of_status", "field_of", "status_pb2"]


class KplanError(Exception):
    """A failed call: the gRPC code, the server's message and the offending field."""

    def __init__(self, code: grpc.StatusCode, message: str, field: Optional[str]):
        super().__init__(f"{code.name}: {message}" + (f" [field: {field}]" if field else ""))
        self.code = code
        self.message = message
        self.field = field


def field_of_status(status: status_pb2.Status) -> Optional[str]:
    """The field named by a google.rpc.BadRequest detail of `status`, if any."""
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad) and bad.field_violations:
            return bad.field_violations[0].field
    return None


def field_of(error: grpc.RpcError) -> Optional[str]:
    """The field named by a google.rpc.BadRequest detail, if the server sent one."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            return field_of_status(status_pb2.Status.FromString(value))
    return None
