"""Read an HTTP request body within the front end's size and time limits, into one buffer, or
refuse it from its head (size, encoding) in Triton's words."""

from __future__ import annotations

import asyncio

from aiohttp import web

from model_runtime.errors import ProtocolError
from model_runtime.server import answers
from model_runtime.server.answers import HTTPError
from model_runtime.server.tensors.binary import HEADER_LENGTH

__all__ = ["ENCODINGS", "HEADER_LENGTH", "body_timeout", "read_body", "refuse_head", "too_large"]


#: The request encodings Triton reads (any other is refused, as Triton refuses it).
ENCODINGS = frozenset({"identity", "gzip", "deflate"})


def too_large(request: web.Request, size: int, limit: int) -> ProtocolError:
    """A body of ``size`` bytes past ``limit``, in Triton's words for the kind of body (JSON,
    JSON and binary tensors, or a raw binary request)."""
    header = request.headers.get(HEADER_LENGTH)
    if header is None:
        return answers.json_too_large(size, limit)
    if header.strip() == "0":
        return answers.raw_input_too_large(size, limit)
    return answers.request_too_large(size, limit)


def refuse_head(request: web.Request, limit: int) -> HTTPError | None:
    """The answer to a request whose head already says it will not be read (None: read it):
    an encoding Triton does not read (501), or a ``Content-Length`` past ``limit`` (400)."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ENCODINGS:
        return answers.unsupported_encoding()
    size = request.content_length
    if size is not None and size > limit:
        return HTTPError(400, str(too_large(request, size, limit)), "too_large")
    return None


def body_timeout(timeout: float | None) -> HTTPError:
    """The answer to a body that did not arrive within ``timeout`` seconds (408)."""
    return HTTPError(408, f"the request body did not arrive within {timeout} s", "body_timeout")


async def read_body(request: web.Request, limit: int, timeout: float | None) -> bytearray:
    """The body, read into one buffer sized from ``Content-Length`` (no second copy as
    ``request.read()`` makes), within ``limit`` bytes and ``timeout`` seconds (None: none).
    A gzip or deflate body is inflated by aiohttp as it is read: the limit holds for what it
    inflates to, and one that expands past it is refused as soon as it does.

    Raises:
        HTTPError: 400 past the size limit (in Triton's words: :func:`too_large`, or its text
            for a compressed body), 408 past the time limit.
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
        raise body_timeout(timeout) from None
    finally:
        view.release()
    if filled < len(body):
        del body[filled:]  # the client sent less than it announced (then closed)
    return body
