"""The daemon's end of an instance's socket: an asyncio protocol that cuts frames.

Frames are handed to ``on_frame`` as they complete, in ``data_received`` itself (no task, no
extra turn of the event loop per frame). A frame over the limits, or a handler that finds one
broken, ends the channel with the reason; EOF ends it without one. Frames written during one
turn of the event loop leave together, in order, in one write at the end of that turn (one
syscall, and one wake-up of the instance, for the requests of many clients); a frame that
already gathers a turn's requests (the batcher's, sent at the end of a turn) may leave at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from model_runtime.python_backend.wire import (
    FRAME,
    MAX_HEADER,
    MAX_PAYLOAD,
    WireError,
    parse_header,
)

__all__ = ["Channel"]

#: what a broken frame raises in its handler (ended channel: the instance is killed)
BROKEN = (WireError, KeyError, TypeError, ValueError)


class Channel(asyncio.Protocol):
    """Frames in (``on_frame(header, payload)``), ``closed`` resolved with the reason (None: a
    plain EOF) once the peer is gone or sent something that does not parse."""

    def __init__(self, on_frame: Callable[[dict[str, Any], memoryview], None]) -> None:
        self._on_frame = on_frame
        self._inbox = bytearray()
        self._outbox: list[bytes | memoryview] = []
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but are one in all we use.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        inbox = self._inbox
        inbox += data
        pos = 0
        size = len(inbox)
        try:
            while size - pos >= FRAME.size:
                hlen, plen = FRAME.unpack_from(inbox, pos)
                if hlen > MAX_HEADER or plen > MAX_PAYLOAD:
                    raise WireError(f"a frame of {hlen}+{plen} bytes is over the limits")
                start = pos + FRAME.size
                end = start + hlen + plen
                if size < end:
                    break
                header = parse_header(bytes(inbox[start : start + hlen]))
                payload = memoryview(bytes(inbox[start + hlen : end])) if plen else memoryview(b"")
                pos = end
                self._on_frame(header, payload)
        except BROKEN as exc:
            self._end(f"sent a frame that does not parse ({exc})")
            return
        del inbox[:pos]

    def _end(self, reason: str | None) -> None:
        self._outbox.clear()
        if not self.closed.done():
            self.closed.set_result(reason)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(None)

    def write(self, segments: list[bytes | memoryview], now: bool = False) -> bool:
        """Send one frame's segments (at the end of this turn of the event loop, with the
        other frames of the turn; ``now``: at once, after the frames still waiting: a frame
        that already gathers a turn's requests); False if the channel is closed."""
        if self.transport is None or self.transport.is_closing():
            return False
        outbox = self._outbox
        if now:
            if outbox:
                outbox += segments
                self._flush()  # (the flush it had asked for finds nothing left)
            else:
                self.transport.writelines(segments)
            return True
        if not outbox:
            self._loop.call_soon(self._flush)
        outbox += segments
        return True

    def _flush(self) -> None:
        transport = self.transport
        if self._outbox and transport is not None and not transport.is_closing():
            transport.writelines(self._outbox)
        self._outbox = []

    def close(self) -> None:
        self._end(None)
