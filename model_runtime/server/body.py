"""Read an HTTP request body within the front end's size and time limits, into one buffer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from model_runtime.server import answers
from model_runtime.server.answers import HTTPError

__all__ = ["read_body"]


async def read_body(
    request: web.Request,
    limit: int,
    timeout: float | None,
    too_large: Callable[[web.Request, int, int], Exception],
) -> bytearray:
    """The body, read into one buffer sized from ``Content-Length`` (no second copy as
    ``request.read()`` makes), within ``limit`` bytes and ``timeout`` seconds (None: none).
    A gzip or deflate body is inflated by aiohttp as it is read: the limit holds for what it
    inflates to, and one that expands past it is refused as soon as it does.

    Raises:
        HTTPError: 400 past the size limit (``too_large(request, size, limit)`` says why in
            Triton's words; a compressed body in Triton's words for it), 408 past the time
            limit.
    """
    length = request.content_length
    content = request.content
    compressed = request.headers.get("Content-Encoding", "identity").lower() != "identity"
    if length is not None and content.is_eof() and content.total_bytes == length:
        # All of it arrived with the head (the common case for small bodies): no waiting,
        # so no timer to arm; aiohttp's parser already held it to Content-Length.
        return bytearray(await content.read())
    body = bytearray(length or 0)
    view = memoryview(body)
    filled = 0
    try:
        async with asyncio.timeout(timeout):
            while chunk := await request.content.readany():
                end = filled + len(chunk)
                if end > limit:
                    why = (
                        answers.decompressed_too_large(limit)
                        if compressed
                        else too_large(request, end, limit)
                    )
                    raise HTTPError(400, str(why), "too_large")
                if end <= len(body):
                    view[filled:end] = chunk
                else:  # chunked, or longer than announced
                    view.release()
                    body[filled:] = chunk
                    view = memoryview(body)
                filled = end
    except TimeoutError:
        raise HTTPError(
            408,
            f"the request body did not arrive within {timeout} s",
            "body_timeout",
        ) from None
    finally:
        view.release()
    if filled < len(body):
        del body[filled:]  # the client sent less than it announced (then closed)
    return body
