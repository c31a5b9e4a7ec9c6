"""The bytes a connection has received ahead of where it reads (a pipelining client's next
requests, while one is answered), kept as the chunks that came: never joined or sliced per
request, so reading the N-th request costs the same however much the client sent."""

from __future__ import annotations

from collections import deque

from model_runtime.server.http.heads import MAX_HEAD_BYTES

__all__ = ["HeldBytes"]


class HeldBytes:
    """Chunks in order, the first unread from an offset; ``size``: the bytes unread (0 exactly
    when none is held: no empty chunk is kept)."""

    __slots__ = ("_at", "_chunks", "size")

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._at = 0
        self.size = 0

    def __bool__(self) -> bool:
        return bool(self._chunks)

    def add(self, data: bytes, pos: int = 0) -> None:
        """Keep ``data[pos:]`` after what is held (copied only if ``pos`` and not first)."""
        if pos >= len(data):
            return
        if not self._chunks:
            self._at = pos
        elif pos:
            data, pos = data[pos:], 0
        self._chunks.append(data)
        self.size += len(data) - pos

    def put_back(self, data: bytes, pos: int) -> None:
        """Keep ``data[pos:]`` before what is held (what :meth:`take` gave, unread)."""
        if pos < len(data):
            self._chunks.appendleft(data)
            self._at = pos
            self.size += len(data) - pos

    def take(self) -> tuple[bytes, int]:
        """The first chunk and where it is unread from (there is one)."""
        data, pos = self._chunks.popleft(), self._at
        self._at = 0
        self.size -= len(data) - pos
        return data, pos

    def take_head(self) -> tuple[bytes, int]:
        """As :meth:`take`, but a head cut between chunks is joined to the rest of it (its
        bytes are copied once more, not the chunks')."""
        data, pos = self.take()
        chunks = self._chunks
        while chunks and len(data) - pos < MAX_HEAD_BYTES and data.find(b"\r\n\r\n", pos) < 0:
            more = chunks.popleft()
            self.size -= len(more)
            data, pos = data[pos:] + more, 0
        return data, pos

    def clear(self) -> None:
        self._chunks.clear()
        self._at = self.size = 0
