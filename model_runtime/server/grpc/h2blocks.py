"""The request header blocks and stream ends of one HTTP/2 connection, read from its bytes, so
that nghttp2 need not call into Python once per header or per frame (:mod:`.h2proto`).

nghttp2's session still receives every byte and acts on it (its HPACK state, stream states,
flow control, HTTP messaging rules, flood limits); the connection acts on what these say only
where nghttp2 took it. :class:`HeaderBlocks` is fed the same reads first: it follows the
frames, and gives for each read the decoded block of each stream it opens (a HEADERS frame's,
with its CONTINUATIONs: :attr:`HeaderBlocks.blocks`), the streams it ends (END_STREAM) and
resets (RST_STREAM), and whether it had a GOAWAY. A block is decoded by the connection's own
nghttp2 HPACK decoder, which is given every block that may change HPACK's dynamic table, in
order, as the session's is; or taken from the connection's cache: only a block that leaves the
table as it was (indexed fields and literals without indexing: :func:`keeps_table`) is cached,
and every block that may change the table empties the cache, so a cached block decodes now as
it did then (gRPC clients send the same block, of indexed fields, for each call after the
first).

A block past :data:`MAX_HEADER_LIST` (the rest of it is not decoded: the decoder can no longer
follow the session's) or one HPACK cannot decode sets :attr:`HeaderBlocks.lost`: each stream
opened from then on has the block :data:`LOST` (the connection resets the too big one's stream,
refuses the later ones and sends GOAWAY; the frames are still followed for the streams open).
Frames nghttp2 ends the connection for set :attr:`HeaderBlocks.broken`: nothing is read from
then on (the connection ends the session).
"""

from __future__ import annotations

import struct
from typing import Any

from model_runtime.server.grpc import nghttp2 as ng
from model_runtime.server.grpc.nghttp2 import ffi, lib

__all__ = ["LOST", "MAX_CONTINUATIONS", "MAX_HEADER_LIST", "Block", "HeaderBlocks", "keeps_table"]

#: A stream's header list (names, values and 32 bytes a field, as HTTP/2 counts it) past this
#: many bytes resets the stream (and ends the connection's decoding: see the module docstring).
MAX_HEADER_LIST = 64 << 10
#: CONTINUATION frames a header block may have (nghttp2's limit is set to the same).
MAX_CONTINUATIONS = 8
#: The frame size nghttp2 takes (SETTINGS_MAX_FRAME_SIZE's default; the server keeps it).
MAX_FRAME = 16384
#: The client's connection preface ("PRI * HTTP/2.0..."), before its first frame.
PREFACE = 24
#: The cache: blocks of at most CACHE_BLOCK bytes whose header list is at most CACHE_LIST
#: bytes (as HTTP/2 counts it), CACHE_ENTRIES of them a connection (about 40 KiB at most;
#: a gRPC client needs one a method it calls).
CACHE_BLOCK, CACHE_LIST, CACHE_ENTRIES = 1024, 4096, 8

_DATA, _HEADERS, _RST_STREAM, _GOAWAY = ng.DATA, ng.HEADERS, ng.RST_STREAM, ng.GOAWAY
_CONTINUATION, _PUSH_PROMISE = ng.CONTINUATION, ng.PUSH_PROMISE
_END_STREAM = ng.FLAG_END_STREAM
#: A frame's 9-byte header: its length (high byte, low 16 bits), type, flags and stream id.
_HEAD = struct.Struct(">BHBBI").unpack_from


class Block:
    """One decoded header block: ``path`` (``:path``, ``b""``: none), ``headers`` (the fields
    but pseudo-headers, in order; shared by every stream the block came on: read only),
    ``size`` (HTTP/2's size of the header list; None: past :data:`MAX_HEADER_LIST`) and
    ``length`` (its ``content-length``, None: none or not a number); ``note``: what the
    connection's calls made of ``headers`` (None: nothing yet), kept with the block so that a
    cached block's streams share it."""

    __slots__ = ("headers", "length", "note", "path", "size")

    def __init__(
        self, path: bytes, headers: list[tuple[bytes, bytes]], size: int | None,
        length: int | None = None,
    ) -> None:  # fmt: skip
        self.path = path
        self.headers = headers
        self.size = size
        self.length = length
        self.note: Any = None


#: The block of a stream opened once the decoder was lost (the stream is refused).
LOST = Block(b"", [], None)


class HeaderBlocks:
    """The header blocks and stream events of one connection's reads (see the module
    docstring)."""

    __slots__ = ("_cache", "_inflater", "_last", "_open", "_pending", "_skip", "_then",
                 "blocks", "broken", "ends", "goaway", "lost", "resets")  # fmt: skip

    def __init__(self) -> None:
        #: This read's blocks that open a stream (HEADERS of a stream id past every one before:
        #: a stream's later HEADERS are its trailers, not kept), by stream.
        self.blocks: dict[int, Block] = {}
        self._last = 0
        #: The streams this read ended (a HEADERS block or DATA frame with END_STREAM, whole),
        #: and those it reset (RST_STREAM frames), in order; whether it had a GOAWAY.
        self.ends: list[int] = []
        self.resets: list[int] = []
        self.goaway = False
        #: Why no block is given any more (None: they are); the frames are still followed.
        self.lost: str | None = None
        #: Why the frames are not followed any more (None: they are): frames nghttp2 ends the
        #: connection for (the transport ends it too).
        self.broken: str | None = None
        self._cache: dict[bytes, Block] = {}
        self._inflater: Any = None
        #: Bytes to pass over before the next frame (the preface, or a frame's payload), and
        #: what that frame says once it is whole (kind, stream; None: nothing to record).
        self._skip = PREFACE
        self._then: tuple[int, int] | None = None
        #: The start of a frame the read ended in (its header, or a whole HEADERS frame's).
        self._pending = b""
        #: The block being gathered (HEADERS without END_HEADERS): stream, END_STREAM,
        #: fragments.
        self._open: tuple[int, bool, list[bytes]] | None = None

    def close(self) -> None:
        """Free the decoder (the connection is gone)."""
        inflater, self._inflater = self._inflater, None
        if inflater is not None:
            lib.nghttp2_hd_inflate_del(inflater)
        self.lost = self.lost or "the connection is closed"

    def feed(self, data: bytes) -> None:
        """Follow ``data``, the connection's next read: :attr:`blocks`, :attr:`ends`,
        :attr:`resets` and :attr:`goaway` say what it brought (the last read's are cleared)."""
        if self.blocks:
            self.blocks.clear()
        if self.ends:
            self.ends.clear()
        if self.resets:
            self.resets.clear()
        self.goaway = False
        if self.broken is not None:
            return
        n = len(data)
        pos = self._skip
        if pos:
            if pos > n:
                self._skip = pos - n
                return
            self._skip = 0
            if self._then is not None:
                self._record(*self._then)
                self._then = None
        if self._pending:
            pos = self._resume(data, pos)
        while pos + 9 <= n:
            high, low, kind, flags, stream_id = _HEAD(data, pos)
            length = high << 16 | low
            end = pos + 9 + length
            if kind == _DATA:  # (the frames of a call, most common first)
                if self._open is not None:
                    self._break("a frame inside a header block")
                    return
                if flags & _END_STREAM:
                    stream_id &= 0x7FFFFFFF
                    if end > n:
                        self._skip, self._then = end - n, (_DATA, stream_id)
                        return
                    self.ends.append(stream_id)
            elif kind in (1, 9):  # HEADERS, CONTINUATION
                if length > MAX_FRAME:
                    self._break("a frame past the frame size")
                    return
                if end > n:
                    break
                self._frame(data, pos, end, kind, flags, stream_id & 0x7FFFFFFF)
                if self.broken is not None:
                    return
            elif self._open is not None or kind == _PUSH_PROMISE:
                self._break("a frame nghttp2 ends the connection for")
                return
            elif kind in (3, 7):  # RST_STREAM, GOAWAY
                stream_id &= 0x7FFFFFFF
                if end > n:
                    self._skip, self._then = end - n, (kind, stream_id)
                    return
                self._record(kind, stream_id)
            if end > n:
                self._skip = end - n
                return
            pos = end
        if pos < n:
            self._pending = data[pos:]

    def _record(self, kind: int, stream_id: int) -> None:
        if kind == _DATA:
            self.ends.append(stream_id)
        elif kind == _RST_STREAM:
            self.resets.append(stream_id)
        else:
            self.goaway = True

    def _resume(self, data: bytes, pos: int) -> int:
        """Complete the frame the last read ended in with ``data[pos:]``: the position after
        it (past the end of ``data``: not complete yet)."""
        pending = self._pending
        self._pending = b""
        if len(pending) < 9:
            take = 9 - len(pending)
            pending += data[pos : pos + take]
            pos += take
            if len(pending) < 9:
                self._pending = pending
                return pos
        length = (pending[0] << 16) | (pending[1] << 8) | pending[2]
        kind = pending[3]
        if kind not in (1, 9):  # not HEADERS, CONTINUATION
            if self._open is not None or kind == _PUSH_PROMISE:
                self._break("a frame nghttp2 ends the connection for")
                return len(data)
            stream_id = int.from_bytes(pending[5:9], "big") & 0x7FFFFFFF
            then = None
            if kind in (3, 7):  # RST_STREAM, GOAWAY
                then = (kind, stream_id)
            elif kind == _DATA and pending[4] & ng.FLAG_END_STREAM:
                then = (_DATA, stream_id)
            end = pos + length - (len(pending) - 9)
            if end > len(data):
                self._skip, self._then = end - len(data), then
            elif then is not None:
                self._record(*then)
            return end
        if length > MAX_FRAME:
            self._break("a frame past the frame size")
            return len(data)
        take = 9 + length - len(pending)
        pending += data[pos : pos + take]
        if len(pending) < 9 + length:
            self._pending = pending
            return len(data)
        stream_id = int.from_bytes(pending[5:9], "big") & 0x7FFFFFFF
        self._frame(pending, 0, 9 + length, kind, pending[4], stream_id)
        return pos + take

    def _frame(self, buf: bytes, pos: int, end: int, kind: int, flags: int, stream_id: int) -> None:
        """A whole HEADERS or CONTINUATION frame (``kind``), ``buf[pos:end]``, its header's
        ``flags`` and ``stream_id``."""
        start = pos + 9
        if kind == _HEADERS:
            if self._open is not None:
                self._break("a HEADERS frame inside a header block")
                return
            if flags & ng.FLAG_PADDED:
                if start >= end:
                    self._break("a padded frame without its pad length")
                    return
                end -= buf[start]
                start += 1
            if flags & ng.FLAG_PRIORITY:
                start += 5
            if end < start:
                self._break("a frame's padding past its payload")
                return
            ends = bool(flags & ng.FLAG_END_STREAM)
            if flags & ng.FLAG_END_HEADERS:
                self._done(stream_id, ends, buf[start:end])
            else:
                self._open = (stream_id, ends, [buf[start:end]])
            return
        block = self._open
        if block is None or block[0] != stream_id or len(block[2]) > MAX_CONTINUATIONS:
            self._break("a CONTINUATION frame nghttp2 ends the connection for")
            return
        block[2].append(buf[start:end])
        if flags & ng.FLAG_END_HEADERS:
            self._open = None
            self._done(stream_id, block[1], b"".join(block[2]))

    def _done(self, stream_id: int, ends: bool, block: bytes) -> None:
        decoded = LOST
        if self.lost is None:
            cached = self._cache.get(block)
            decoded = cached if cached is not None else (self._decode(block) or LOST)
        if stream_id > self._last:  # (else: trailers)
            self._last = stream_id
            self.blocks[stream_id] = decoded
        if ends:
            self.ends.append(stream_id)

    def _decode(self, block: bytes) -> Block | None:
        """Decode ``block`` with the connection's decoder (None: it cannot be, :attr:`lost`)."""
        inflater = self._inflater
        if inflater is None:
            holder = ffi.new("nghttp2_hd_inflater **")
            if lib.nghttp2_hd_inflate_new(holder) != 0:
                self._lose("no memory for an HPACK decoder")
                return None
            inflater = self._inflater = holder[0]
        keeps = keeps_table(block)
        before = _table_state(inflater)
        nv = ffi.new("nghttp2_nv *")
        flags = ffi.new("int *")
        source = ffi.from_buffer(block)
        buffer = ffi.buffer
        headers: list[tuple[bytes, bytes]] = []
        path = b""
        size = 0
        length = None
        pos, n = 0, len(block)
        while True:
            read = lib.nghttp2_hd_inflate_hd2(inflater, nv, flags, source + pos, n - pos, 1)
            if read < 0:
                self._lose(f"a header block HPACK cannot decode ({read})")
                return None
            pos += read
            if flags[0] & ng.HD_INFLATE_EMIT:
                name = buffer(nv.name, nv.namelen)[:]
                value = buffer(nv.value, nv.valuelen)[:]
                size += len(name) + len(value) + 32
                if size > MAX_HEADER_LIST:  # (the rest is not decoded: the decoder is lost)
                    self._lose("a header block past the header list limit")
                    return Block(b"", [], None)
                if name[:1] != b":":
                    headers.append((name, value))
                    if name == b"content-length":  # (nghttp2 checks it at the request's end)
                        length = int(value) if value.isdigit() else None
                elif name == b":path":
                    path = value
            if flags[0] & ng.HD_INFLATE_FINAL:
                lib.nghttp2_hd_inflate_end_headers(inflater)
                break
            if read == 0 and not flags[0] & ng.HD_INFLATE_EMIT:  # (never, with in_final)
                self._lose("an HPACK decoder that stopped")
                return None
        decoded = Block(path, headers, size, length)
        cache = self._cache
        if not keeps or _table_state(inflater) != before:  # (the second: never, or a bug)
            cache.clear()
        elif n <= CACHE_BLOCK and size <= CACHE_LIST:
            if len(cache) >= CACHE_ENTRIES:
                cache.clear()
            cache[block] = decoded
        return decoded

    def _lose(self, why: str) -> None:
        self.lost = why
        self._cache.clear()

    def _break(self, why: str) -> None:
        self.broken = self.lost = why
        self._pending = b""
        self._open = None
        self._cache.clear()


def _table_state(inflater: Any) -> tuple[int, int]:
    return (
        lib.nghttp2_hd_inflate_get_num_table_entries(inflater),
        lib.nghttp2_hd_inflate_get_dynamic_table_size(inflater),
    )


def keeps_table(block: bytes) -> bool:
    """Whether decoding ``block`` leaves HPACK's dynamic table as it was (RFC 7541 §6): it has
    only indexed fields and literals without indexing or never indexed, no literal with
    incremental indexing and no table size update. False where unsure (a block cut short)."""
    pos, n = 0, len(block)
    while pos < n:
        first = block[pos]
        if first & 0x80:  # indexed field: a 7-bit prefix index
            pos = _after_int(block, pos, 0x7F)
        elif first & 0xE0 == 0:  # literal without indexing (0000) or never indexed (0001)
            pos = _after_int(block, pos, 0x0F) if first & 0x0F else _after_string(block, pos + 1)
            pos = _after_string(block, pos)
        else:  # literal with incremental indexing (01), table size update (001)
            return False
        if pos < 0:
            return False
    return True


def _after_int(block: bytes, pos: int, mask: int) -> int:
    """Where the integer of ``mask``'s prefix at ``pos`` ends (-1: cut short or too long)."""
    if block[pos] & mask != mask:
        return pos + 1
    for end in range(pos + 1, min(pos + 6, len(block))):
        if not block[end] & 0x80:
            return end + 1
    return -1


def _after_string(block: bytes, pos: int) -> int:
    """Where the string literal at ``pos`` ends (-1: cut short)."""
    n = len(block)
    if pos < 0 or pos >= n:
        return -1
    length = block[pos] & 0x7F
    if length == 0x7F:
        length, shift = 0x7F, 0
        pos += 1
        while True:
            if pos >= n or shift > 28:
                return -1
            byte = block[pos]
            length += (byte & 0x7F) << shift
            shift += 7
            pos += 1
            if not byte & 0x80:
                break
        end = pos + length
    else:
        end = pos + 1 + length
    return end if end <= n else -1
