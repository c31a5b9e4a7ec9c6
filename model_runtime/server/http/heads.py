"""Reading HTTP/1.1 request framing without aiohttp, for refusals at the protocol level.

The connection guard (:mod:`model_runtime.server.http.guard`) answers a request it will refuse
anyway (an infer request over its model's admission limit) from prebuilt bytes, without
building an aiohttp request for it. It may only do so for a head whose framing it knows for
sure, at a point of the byte stream it knows is a message boundary:

- :func:`plain_head` accepts a small subset of HTTP/1.1 and says None to everything else, which
  then goes to aiohttp untouched (and is refused, or rejected as malformed, there). A plain
  head: ``POST <target> HTTP/1.1``, complete (its blank line within :data:`MAX_HEAD_BYTES`),
  only printable bytes and tabs besides its CRLF line ends (no bare CR or LF), every header
  line ``name:value`` with no blank around the name, one ``Content-Length`` of decimal digits
  within ``max_body``, and no ``Transfer-Encoding``, ``Expect``, ``Upgrade`` or
  ``Connection: close`` (whose framing or effect aiohttp handles). Nothing aiohttp's parser
  would refuse (a 400 it gives) is plain either: the target is visible ASCII, every header name
  a token (RFC 9110 §5.1), exactly one ``Host`` (RFC 9112 §3.2), at most
  :data:`MAX_PLAIN_HEADERS` header lines.
- :class:`Framer` follows the bytes given to aiohttp (heads and ``Content-Length`` bodies)
  and says whether they end at a message boundary. A stream it cannot frame for certain
  (chunked bodies, a head that is not plain in the framing sense) makes it give up for the
  connection's lifetime: ``lost``, never at a boundary again.
"""

from __future__ import annotations

__all__ = ["MAX_HEAD_BYTES", "MAX_PLAIN_HEADERS", "Framer", "chunked_over_length", "plain_head"]

#: The longest head read here; a longer one goes to aiohttp.
MAX_HEAD_BYTES = 8192
_PASS_ON = frozenset({b"transfer-encoding", b"expect", b"upgrade"})
#: More header lines than this go to aiohttp (whose own limit is 128).
MAX_PLAIN_HEADERS = 64
#: RFC 9110 §5.6.2 token characters, and visible ASCII (a request target's).
_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_VISIBLE = bytes(range(0x21, 0x7F))
# Control bytes other than tab, CR and LF: not in a plain head.
_CONTROL = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])


def _not_plain(head: bytes) -> bool:
    """Whether ``head`` holds a control byte (tab aside) or a CR or LF outside a CRLF pair.
    (Counting is some 10x cheaper than a regular expression here, and runs per request: every
    CR is in a pair when there are as many CRs as CRLFs, every LF when as many LFs.)"""
    pairs = head.count(b"\r\n")
    return (
        head.count(b"\r") != pairs
        or head.count(b"\n") != pairs
        or len(head.translate(None, _CONTROL)) != len(head)
    )


def _body_length(head: bytes, line_end: int, *, strict: bool) -> int | None:
    """The ``Content-Length`` of ``head`` (the head without its blank line; its request
    line ends at ``line_end``): 0 without one; None when the framing is not plain (see the
    module docstring; ``strict`` also refuses what a plain *refusable* head may not have)."""
    if _not_plain(head):
        return None
    length = -1
    hosts = 0
    if line_end < len(head):  # header lines
        lines = head[line_end + 2 :].split(b"\r\n")
        if strict and len(lines) > MAX_PLAIN_HEADERS:
            return None
        for line in lines:
            name, colon, value = line.partition(b":")
            key = name.lower()
            if not colon or not key or key != key.strip():
                return None
            if strict and key.translate(None, _TOKEN):
                return None  # not a token: aiohttp refuses it
            if key == b"host":
                hosts += 1
            elif key == b"content-length":
                value = value.strip(b" \t")
                if length >= 0 or not value.isdigit() or len(value) > 18:
                    return None
                length = int(value)
            elif key == b"transfer-encoding" or (
                strict and (key in _PASS_ON or (key == b"connection" and b"close" in value.lower()))
            ):
                return None
    if not strict:
        return max(length, 0)
    return length if length >= 0 and hosts == 1 else None


def plain_head(data: bytes, max_body: int, start: int = 0) -> tuple[bytes, int, int] | None:
    """``(target, head_size, body_size)`` when ``data`` opens (at ``start``: nothing before it
    is read or copied) with a plain POST head (see the module docstring): the request target,
    the bytes of the head (blank line included) and the body's ``Content-Length``; else None.

    Raises:
        nothing: any bytes give a result.
    """
    head_end = data.find(b"\r\n\r\n", start, start + MAX_HEAD_BYTES)
    if head_end < 0:
        return None
    head = data[start : head_end + 4]
    read = _READ.get(head, _UNREAD)
    if read is _UNREAD:
        read = _read_head(data, start, head_end)
        if len(_READ) >= _READ_MAX:
            _READ.clear()
        _READ[head] = read
    if read is None or read[2] > max_body:
        return None
    return read


#: What :func:`plain_head` read of each head (by its bytes: clients repeat theirs), emptied
#: when full.
_READ: dict[bytes, tuple[bytes, int, int] | None] = {}
_READ_MAX = 512
_UNREAD = (b"", -1, -1)


def _read_head(data: bytes, start: int, head_end: int) -> tuple[bytes, int, int] | None:
    """:func:`plain_head` of the head at ``data[start:head_end]``, any body size."""
    line_end = data.find(b"\r\n", start)
    request_line = data[start:line_end].split(b" ")
    if len(request_line) != 3 or request_line[0] != b"POST" or request_line[2] != b"HTTP/1.1":
        return None
    if request_line[1].translate(None, _VISIBLE):
        return None  # a control or non-ASCII byte in the target
    length = _body_length(data[start:head_end], line_end - start, strict=True)
    if length is None:
        return None
    return request_line[1], head_end + 4 - start, length


def chunked_over_length(data: bytes) -> bytes | None:
    """``data`` (bytes that begin a request) with its head's ``Content-Length`` dropped and
    ``Connection: close`` added, when the head, complete in ``data``, says both a chunked
    ``Transfer-Encoding`` and a ``Content-Length``; else None. RFC 9112 §6.3: the transfer
    coding decides the body's length, and the server closes the connection after its answer
    (so no request can be smuggled after the body). aiohttp refuses such a head outright;
    Triton (libevhtp) reads the chunked body, and its clients send such heads (a ``requests``
    body of bytes with a ``Transfer-Encoding: chunked`` header of the caller's).

    Raises:
        nothing.
    """
    head_end = data.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES)
    if head_end < 0 or data.find(b"chunked", 0, head_end) < 0:
        return None
    lines = data[:head_end].split(b"\r\n")
    names = [line.partition(b":")[0].strip().lower() for line in lines]
    if b"transfer-encoding" not in names or b"content-length" not in names:
        return None
    te = b",".join(
        line.partition(b":")[2]
        for line, n in zip(lines, names, strict=True)
        if n == b"transfer-encoding"
    )
    if te.strip().lower().rsplit(b",", 1)[-1].strip() != b"chunked":
        return None  # the body's length is not the chunked coding's: aiohttp refuses it
    kept = [
        line
        for line, n in zip(lines, names, strict=True)
        if n not in (b"content-length", b"connection")
    ]
    return b"\r\n".join([*kept, b"Connection: close"]) + data[head_end:]


class Framer:
    """Where message boundaries fall in one connection's request bytes (see the module
    docstring). Feed it every byte given to aiohttp, in order; :attr:`at_boundary` then says
    whether they end exactly at the end of a message."""

    __slots__ = ("_head", "_remaining", "lost")

    def __init__(self) -> None:
        self._head = b""  # the part of a head seen so far
        self._remaining = 0  # body bytes of the current message still to come
        self.lost = False  # framing unknown from here on: never at a boundary again

    @property
    def at_boundary(self) -> bool:
        """Whether the bytes fed so far end at a message boundary (not inside a head or a
        body, and the framing was never lost)."""
        return not self.lost and not self._remaining and not self._head

    @property
    def mid_head(self) -> bool:
        """Whether the bytes fed so far end inside a head (its first bytes are in, not its
        blank line), with the framing known."""
        return not self.lost and bool(self._head)

    def feed(self, data: bytes, plain: tuple[bytes, int, int] | None = None) -> None:
        """Follow ``data``, the next bytes of the stream; ``plain``: what :func:`plain_head`
        said of ``data`` (given at a boundary: the head is not read again).

        Raises:
            nothing: bytes it cannot frame set :attr:`lost`.
        """
        pos, n = 0, len(data)
        if plain is not None and self.at_boundary:
            _, pos, self._remaining = plain
        while pos < n and not self.lost:
            if self._remaining:
                take = min(self._remaining, n - pos)
                self._remaining -= take
                pos += take
                continue
            start = len(self._head)
            # Only the head's bytes are copied (not a body that came with them).
            head_end = data.find(b"\r\n\r\n", pos, pos + MAX_HEAD_BYTES)
            stop = pos + MAX_HEAD_BYTES if start or head_end < 0 else head_end + 4
            head = self._head + data[pos:stop]
            end = head.find(b"\r\n\r\n", max(0, start - 3))
            if end < 0:
                if len(head) >= MAX_HEAD_BYTES:
                    self.lost = True
                else:
                    self._head = head
                return
            if end == 0 and start == 0:  # a blank line between messages: not plain
                self.lost = True
                return
            line_end = head.find(b"\r\n")
            length = _body_length(head[:end], line_end, strict=False)
            if length is None:
                self.lost = True
                return
            pos += end + 4 - start
            self._head = b""
            self._remaining = length
