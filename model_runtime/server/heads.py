"""Reading a plain HTTP/1.1 request head without aiohttp, for refusals at the protocol level.

The connection guard (:mod:`model_runtime.server.connections`) answers a request it will refuse
anyway (an infer request over its model's admission limit) from prebuilt bytes, without
building an aiohttp request for it. It may only do so for a head whose framing it knows for
sure: :func:`plain_head` accepts a small subset of HTTP/1.1 and says None to everything else,
which then goes to aiohttp untouched (and is refused, or rejected as malformed, there).

A plain head: ``POST <target> HTTP/1.1``, complete (its blank line within
:data:`MAX_HEAD_BYTES`), every header line ``name:value`` with no blank around the name, one
``Content-Length`` of decimal digits within ``max_body``, and no ``Transfer-Encoding``,
``Expect``, ``Upgrade`` or ``Connection: close`` (whose framing or effect aiohttp handles).
"""

from __future__ import annotations

__all__ = ["MAX_HEAD_BYTES", "plain_head"]

#: The longest head read here; a longer one goes to aiohttp.
MAX_HEAD_BYTES = 8192
_PASS_ON = frozenset({b"transfer-encoding", b"expect", b"upgrade"})


def plain_head(data: bytes, max_body: int) -> tuple[bytes, int, int] | None:
    """``(target, head_size, body_size)`` when ``data`` opens with a plain POST head (see the
    module docstring): the request target, the bytes of the head (blank line included) and
    the body's ``Content-Length``; else None.

    Raises:
        nothing: any bytes give a result.
    """
    head_end = data.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES)
    if head_end < 0:
        return None
    line_end = data.find(b"\r\n")
    request_line = data[:line_end].split(b" ")
    if len(request_line) != 3 or request_line[0] != b"POST" or request_line[2] != b"HTTP/1.1":
        return None
    length = -1
    if line_end < head_end:  # header lines
        for line in data[line_end + 2 : head_end].split(b"\r\n"):
            name, colon, value = line.partition(b":")
            key = name.lower()
            if not colon or not key or key != key.strip():
                return None
            if key == b"content-length":
                value = value.strip(b" \t")
                if length >= 0 or not value.isdigit() or len(value) > 18:
                    return None
                length = int(value)
            elif key in _PASS_ON or (key == b"connection" and b"close" in value.lower()):
                return None
    if not 0 <= length <= max_body:
        return None
    return request_line[1], head_end + 4, length
