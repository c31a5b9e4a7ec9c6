"""gRPC's framing over HTTP/2, for the native transport (:mod:`.native`).

A message on the wire is a 5-byte prefix (a compressed flag, a big-endian u32 length) and that
many bytes; a call ends with trailers ``grpc-status`` (a number) and ``grpc-message``
(percent-encoded UTF-8). :class:`MessageReader` takes a stream's body chunks as HTTP/2 gives
them and yields whole messages, refusing one whose declared length passes the limit as soon as
its prefix is in (before its bytes are buffered), and inflating ``gzip``/``deflate`` messages
within the same limit. :func:`parse_timeout` reads ``grpc-timeout``.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np

__all__ = [
    "ACCEPT_ENCODING",
    "CallEnded",
    "GrpcAbort",
    "MessageReader",
    "frame",
    "parse_timeout",
    "status_trailers",
]

#: The request encodings this server reads (``grpc-accept-encoding``).
ACCEPT_ENCODING = b"identity,gzip,deflate"
_WBITS = {"gzip": 31, "deflate": 15}
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


class GrpcAbort(Exception):
    """Ends a call with ``code`` and ``details`` (what ``context.abort`` raises)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallEnded(Exception):
    """The client reset the stream or closed the connection: nothing more can be sent."""


def frame(payload: bytes) -> bytes:
    """``payload`` as one uncompressed gRPC message."""
    return b"\0" + len(payload).to_bytes(4, "big") + payload


def _percent(text: str) -> bytes:
    raw = text.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def status_trailers(code: grpc.StatusCode, details: str = "") -> list[tuple[bytes, bytes]]:
    """The trailers that end a call with ``code`` (and ``details``, if any)."""
    trailers = [(b"grpc-status", str(code.value[0]).encode())]
    if details:
        trailers.append((b"grpc-message", _percent(details)))
    return trailers


def parse_timeout(value: bytes | None) -> float | None:
    """Seconds of a ``grpc-timeout`` value (``100m``: 0.1); None when absent.

    Raises:
        GrpcAbort: INTERNAL, the value is not gRPC's form (up to 8 digits and a unit).
    """
    if value is None:
        return None
    digits, unit = value[:-1], value[-1:].decode("latin-1")
    if not (1 <= len(digits) <= 8 and digits.isdigit() and unit in _TIMEOUT_UNITS):
        raise GrpcAbort(grpc.StatusCode.INTERNAL, f"invalid grpc-timeout {value!r}")
    return int(digits) * _TIMEOUT_UNITS[unit]


Receive = Callable[[], Awaitable[dict[str, Any]]]
#: ``admit(length)``: before a message of ``length`` bytes is read, count it (return how to
#: give it back) or refuse it (raise :class:`GrpcAbort`).
Admit = Callable[[int], Callable[[], None]]
#: Messages from this size on are admitted before they are read; smaller ones cost nothing.
ADMIT_FROM = 64 << 10


class MessageReader:
    """The messages of one request stream, read from its ASGI ``receive``.

    ``max_size``: the largest message, compressed or inflated; ``encoding``: the stream's
    ``grpc-encoding`` (None or ``identity``: messages must not be compressed); ``admit``:
    asked before a message of :data:`ADMIT_FROM` bytes or more is read. A message read across
    chunks is copied once, into a buffer of the length its prefix announced; what ``admit``
    counted for it stays counted until the next message is asked for or :meth:`close`.
    """

    __slots__ = ("_admit", "_buf", "_encoding", "_ended", "_held", "_max", "_partial", "_receive")

    def __init__(
        self, receive: Receive, max_size: int, encoding: str | None, admit: Admit | None = None
    ) -> None:
        if encoding in (None, "identity"):
            encoding = None
        elif encoding not in _WBITS:
            raise GrpcAbort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"Compression algorithm '{encoding}' is not supported by this server",
            )
        self._receive = receive
        self._admit = admit
        self._max = max_size
        self._encoding = encoding
        self._buf = bytearray()
        self._ended = False
        self._partial = False
        self._held: Callable[[], None] | None = None

    @property
    def ended(self) -> bool:
        """Whether the client ended its request stream (all of it is read)."""
        return self._ended

    @property
    def partial(self) -> bool:
        """Whether a message was announced and not read whole (its bytes wait unread)."""
        return self._partial

    @property
    def counted(self) -> bool:
        """Whether ``admit`` counted the last message (until the next or :meth:`close`)."""
        return self._held is not None

    def close(self) -> None:
        """Give back what ``admit`` counted for the last message (idempotent)."""
        held, self._held = self._held, None
        if held is not None:
            held()

    async def _chunk(self) -> bytes:
        """The next body chunk of the request stream (the stream must not have ended).

        Raises:
            CallEnded: the client reset the stream or left.
        """
        event = await self._receive()
        if event["type"] != "http.request":
            raise CallEnded()
        self._ended = not event.get("more_body", False)
        body: bytes = event.get("body", b"")
        return body

    async def _more(self) -> bool:
        """Read the next chunk into the buffer; False at the end of the request stream.

        Raises:
            CallEnded: the client reset the stream or left.
        """
        if self._ended:
            return False
        self._buf += await self._chunk()
        return True

    async def next(self) -> bytes | None:
        """The next message (None: the client ended its stream between messages).

        Raises:
            GrpcAbort: RESOURCE_EXHAUSTED, a message past the limit or refused by ``admit``
                (before its bytes are read); INTERNAL, the stream ended inside a message, or a
                message is compressed without an encoding, or does not inflate.
            CallEnded: the client reset the stream or left.
        """
        self.close()
        buf = self._buf
        if not buf and not self._ended:
            # The common case, a chunk that holds whole messages: sliced, not buffered.
            chunk = await self._chunk()
            if len(chunk) >= 5:
                end = 5 + int.from_bytes(chunk[1:5], "big")
                if end - 5 <= self._max and len(chunk) >= end:
                    if len(chunk) > end:
                        buf += chunk[end:]
                    payload = chunk[5:end]
                    return payload if chunk[0] == 0 else self._inflate(payload)
            buf += chunk
        while len(buf) < 5:
            if not await self._more():
                if buf:
                    raise GrpcAbort(grpc.StatusCode.INTERNAL, "the stream ended in a message")
                return None
        flag = buf[0]
        length = int.from_bytes(buf[1:5], "big")
        if length > self._max:
            raise GrpcAbort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({length} vs. {self._max})",
            )
        end = 5 + length
        if len(buf) >= end:
            payload = bytes(buf[5:end])
            del buf[:end]
        else:
            self._partial = True
            if self._admit is not None and length >= ADMIT_FROM:
                self._held = self._admit(length)
            payload = await self._fill(length)
            self._partial = False
        if flag == 0:
            return payload
        return self._inflate(payload)

    async def _fill(self, length: int) -> bytes:
        """The message of ``length`` bytes whose prefix (and maybe some bytes) is buffered:
        each chunk copied once into a buffer of that length (bytes-like: a memoryview).

        Raises:
            GrpcAbort: INTERNAL, the stream ended inside the message.
            CallEnded: the client reset the stream or left.
        """
        buf = self._buf
        # Not zero-filled (bytearray(n) writes every page of it on the event loop first).
        view = np.empty(length, np.uint8).data
        got = len(buf) - 5
        view[:got] = memoryview(buf)[5:]
        buf.clear()
        while got < length:
            if self._ended:
                raise GrpcAbort(grpc.StatusCode.INTERNAL, "the stream ended in a message")
            chunk = await self._chunk()
            take = min(len(chunk), length - got)
            view[got : got + take] = memoryview(chunk)[:take]
            got += take
            if take < len(chunk):
                buf += chunk[take:]
        return view  # type: ignore[return-value]  # bytes-like, not copied again

    def _inflate(self, payload: bytes) -> bytes:
        if self._encoding is None:
            raise GrpcAbort(
                grpc.StatusCode.INTERNAL,
                "a message is compressed but the call has no grpc-encoding",
            )
        inflater = zlib.decompressobj(_WBITS[self._encoding])
        try:
            out = inflater.decompress(payload, self._max + 1)
        except zlib.error as exc:
            raise GrpcAbort(grpc.StatusCode.INTERNAL, f"message does not inflate: {exc}") from None
        if len(out) > self._max:
            raise GrpcAbort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max (more than {self._max} bytes inflated)",
            )
        return out
