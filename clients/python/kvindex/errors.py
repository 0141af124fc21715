"""kvindex's errors: every gRPC failure of a Client call is one of these.

A router decides on the class: Overloaded and Unavailable mean "ask again
later or route without kvindex", InvalidArgument means the request is wrong
(its .field names what), Unauthenticated and PermissionDenied mean the
credentials are. The server's own message is .message; .code is the
grpc.StatusCode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import grpc

__all__ = [
    "KvindexError",
    "InvalidArgument",
    "Overloaded",
    "ResourceExhausted",
    "Unauthenticated",
    "PermissionDenied",
    "Unavailable",
    "DeadlineExceeded",
]

# ERROR_DOMAIN and OVERLOAD_REASON mark an admission refusal: a
# google.rpc.ErrorInfo detail the server attaches to RESOURCE_EXHAUSTED
# when it sheds load (api.ErrorDomain, api.OverloadReason), as opposed to a
# request over a limit, which has the same code and no such detail.
ERROR_DOMAIN = "kvindex.io"
OVERLOAD_REASON = "OVERLOADED"

_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_DETAILS_KEY = "grpc-status-details-bin"

# kvindex's InvalidArgument messages start with the field at fault, then
# ": " ("model: unknown model ...", "workers[2].pod: required",
# "token_ids, block_keys, prompt, messages: give exactly one").
_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*(?:, [A-Za-z_][\w.\[\]]*)*): ")


class KvindexError(Exception):
    """A failed call: the gRPC status code, the server's message, and the
    call (method and target) it came from."""

    def __init__(self, code: grpc.StatusCode, message: str, method: str = "", target: str = ""):
        super().__init__(f"kvindex: {method} at {target}: {code.name}: {message}")
        self.code = code
        self.message = message
        self.method = method
        self.target = target


class InvalidArgument(KvindexError):
    """The request is wrong; .field is the field the server named first
    (None when the message names none)."""

    def __init__(self, code, message, method="", target=""):
        super().__init__(code, message, method, target)
        m = _FIELD.match(message)
        self.field: Optional[str] = m.group(1) if m else None


class Overloaded(KvindexError):
    """The server shed the call to protect its latency (admission control):
    retry later with backoff, or route without kvindex. .retry_after is the
    server's suggested delay in seconds from a google.rpc.RetryInfo detail,
    None when it sent none."""

    def __init__(self, code, message, method="", target="", retry_after=None):
        super().__init__(code, message, method, target)
        self.retry_after: Optional[float] = retry_after


class ResourceExhausted(KvindexError):
    """A bound other than overload was reached (routed requests in flight,
    concurrent tokenizations, watches): retrying at once will not help."""


class Unauthenticated(KvindexError):
    """No bearer token, or one the server does not know."""


class PermissionDenied(KvindexError):
    """The token is known but lacks the scope the call needs (Route and
    Release need "route"), or the request belongs to another client."""


class Unavailable(KvindexError):
    """The server could not be reached (or a tokenizer it needed did not
    answer): route without kvindex for now."""


class DeadlineExceeded(KvindexError):
    """The call's deadline passed before the answer came."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


@dataclass(frozen=True)
class _Details:
    """What the client reads of a google.rpc.Status's details."""

    overloaded: bool = False
    retry_after: Optional[float] = None


def from_rpc_error(err: grpc.RpcError, method: str, target: str) -> KvindexError:
    """Returns the KvindexError for a failed call's grpc.RpcError."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = (err.details() if hasattr(err, "details") else None) or ""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        d = _details(err)
        if d.overloaded:
            return Overloaded(code, message, method, target, d.retry_after)
        return ResourceExhausted(code, message, method, target)
    return _BY_CODE.get(code, KvindexError)(code, message, method, target)


def _details(err: grpc.RpcError) -> _Details:
    """Reads the status details trailer of err; an absent or garbled one
    reads as no details (the code alone then decides)."""
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == _DETAILS_KEY and isinstance(value, bytes):
            try:
                return parse_status_details(value)
            except ValueError:
                return _Details()
    return _Details()


def parse_status_details(status: bytes) -> _Details:
    """Decodes a serialized google.rpc.Status for the two details kvindex's
    client acts on: ErrorInfo{reason OVERLOADED, domain kvindex.io} and
    RetryInfo{retry_delay}. The messages are read from the protobuf wire
    format directly (a few fields of three small messages), so the client
    needs no googleapis package. Raises ValueError on a malformed encoding.
    """
    overloaded, retry_after = False, None
    for num, value in _fields(status):
        if num != 3 or not isinstance(value, bytes):  # Status.details: repeated Any
            continue
        any_fields = dict(_fields(value))  # Any: type_url = 1, value = 2
        type_url, body = any_fields.get(1, b""), any_fields.get(2, b"")
        if type_url == _ERROR_INFO.encode():
            info = dict(_fields(body))  # ErrorInfo: reason = 1, domain = 2
            if info.get(1) == OVERLOAD_REASON.encode() and info.get(2) == ERROR_DOMAIN.encode():
                overloaded = True
        elif type_url == _RETRY_INFO.encode():
            delay = dict(_fields(body)).get(1, b"")  # RetryInfo: retry_delay = 1
            d = dict(_fields(delay))  # Duration: seconds = 1, nanos = 2
            retry_after = _signed(d.get(1, 0)) + _signed(d.get(2, 0)) / 1e9
    return _Details(overloaded, retry_after)


def _fields(buf: bytes):
    """Yields (field number, value) of a protobuf message: an int for
    varint and fixed fields, bytes for length-delimited ones."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = int.from_bytes(buf[i : i + 8], "little"), i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = bytes(buf[i : i + n]), i + n
        elif wire == 5:
            value, i = int.from_bytes(buf[i : i + 4], "little"), i + 4
        else:
            raise ValueError(f"status details: wire type {wire} of field {num}")
        if i > len(buf):
            raise ValueError(f"status details: field {num} runs past the end")
        yield num, value


def _varint(buf: bytes, i: int):
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("status details: truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _signed(v: int) -> int:
    """Reads a varint as the int64 it encodes (two's complement)."""
    return v - (1 << 64) if v >= 1 << 63 else v
