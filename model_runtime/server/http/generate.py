"""Triton's generate extension over HTTP: ``POST /v2/models/NAME[/versions/V]/generate`` and
``/generate_stream``, for every model (a decoupled python model's responses as they come, any
other model's one answer), through the data plane
(:mod:`model_runtime.server.inference.generate` reads the request and writes each response).

``generate`` answers one JSON object (``application/json``): the model's one response, or an
error (Triton's ``generate expects model to produce exactly 1 response ...`` for a model that
gave none or several). ``generate_stream`` answers Server-Sent Events
(``text/event-stream; charset=utf-8``), one ``data: {...}`` event per response as it comes;
the status is the first response's (an error's status when the first is an error), so a later
error is an ``{"error": ...}`` event under a 200, as Triton sends it. A request that fails
before its model answers is a JSON error with its status, as every route answers.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from aiohttp import web

from model_runtime.errors import QueueFullError
from model_runtime.python_backend.runner import PythonModelRunner
from model_runtime.server.answers import HTTPError, status_of
from model_runtime.server.http.body import read_body, refuse_head
from model_runtime.server.inference.accounting import THREAD_PARSE_BYTES
from model_runtime.server.inference.admission import OVERLOADED
from model_runtime.server.inference.generate import (
    GENERATE_ONE,
    error_json,
    generate_request,
    generate_response,
)
from model_runtime.server.inference.plane import DataPlane
from model_runtime.server.inference.streaming import Reply, is_decoupled, replies
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.serving import innermost
from model_runtime.server.tensors.request import InferRequest
from model_runtime.server.tensors.shm_io import decode_in_thread

__all__ = ["SSE_CONTENT_TYPE", "GenerateRoutes"]

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"


class GenerateRoutes:
    """The generate extension's handlers over ``plane``."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def routes(self, bases: tuple[str, ...]) -> list[tuple[str, str, Any]]:
        """(method, path, handler) of each route under each model path of ``bases``."""
        out: list[tuple[str, str, Any]] = []
        for base in bases:
            out += [("POST", f"{base}/generate", self.generate)]
            out += [("POST", f"{base}/generate_stream", self.generate_stream)]
        return out

    async def _start(
        self, request: web.Request, entry: ModelEntry
    ) -> tuple[InferRequest, AsyncGenerator[Reply, None]]:
        """The request for ``entry`` read and its reply stream, or the error that answers it."""
        plane = self.plane
        options = plane.options
        refusal = refuse_head(request, options.max_body_size)
        runner = plane.serving_runner(entry, refusal)
        body = await read_body(request, options.max_body_size, options.body_timeout)
        python = isinstance(innermost(runner), PythonModelRunner)

        def parse() -> InferRequest:
            return generate_request(body, entry, options.max_body_size, python=python)

        # As infer bodies: decoding past ~1 MiB goes off the event loop.
        parsed = await decode_in_thread(parse) if len(body) > THREAD_PARSE_BYTES else parse()
        return parsed, replies(plane, entry, runner, parsed)

    async def _admitted(self, request: web.Request, streaming: bool) -> web.StreamResponse:
        """Serve ``request`` within its model's front-end admission (as infer requests are:
        :mod:`model_runtime.server.inference.admission`), but for a decoupled model: how long
        its streams last is the model's to say (a token stream), not work held in a queue."""
        plane = self.plane
        entry = plane.entry(request.match_info["name"], request.match_info.get("version"))
        if is_decoupled(entry):
            if streaming:
                return await self._stream(request, entry)
            return await self._one(request, entry)
        refused = plane.admission.try_admit(entry.name)
        if refused is not None:
            raise HTTPError(503, refused, OVERLOADED)
        queue_full = False
        try:
            if streaming:
                return await self._stream(request, entry)
            return await self._one(request, entry)
        except QueueFullError:
            queue_full = True
            raise
        finally:
            plane.admission.release(entry.name, queue_full=queue_full)

    def _event(self, entry: ModelEntry, request_id: str | None, reply: Reply) -> tuple[int, bytes]:
        if reply.error is not None:
            status = status_of(reply.error)[0]  # the model's answer: not logged as a failure
            return status, error_json(str(reply.error))
        return 200, generate_response(entry, request_id, reply.outputs, reply.parameters)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """``POST .../generate``: one JSON answer (see the module docstring)."""
        return await self._admitted(request, streaming=False)

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        """``POST .../generate_stream``: Server-Sent Events (see the module docstring)."""
        return await self._admitted(request, streaming=True)

    async def _one(self, request: web.Request, entry: ModelEntry) -> web.StreamResponse:
        parsed, stream = await self._start(request, entry)
        got: list[Reply] = []
        async with aclosing(stream):
            async for reply in stream:
                if not reply.empty:
                    got.append(reply)
        if len(got) != 1:
            raise HTTPError(400, GENERATE_ONE, "bad_request")
        status, body = self._event(entry, parsed.id, got[0])
        return web.Response(body=body, status=status, content_type="application/json")

    async def _stream(self, request: web.Request, entry: ModelEntry) -> web.StreamResponse:
        parsed, stream = await self._start(request, entry)
        response: web.StreamResponse | None = None
        async with aclosing(stream):
            try:
                async for reply in stream:
                    if reply.empty:
                        continue
                    status, event = self._event(entry, parsed.id, reply)
                    if response is None:
                        response = await self._open(request, status)
                    await response.write(b"data: " + event + b"\n\n")
            except Exception as exc:
                if response is None:
                    raise  # nothing sent yet: answered as any route's error
                _, message, _, _ = self.plane.error_answer(exc, request.path)
                await response.write(b"data: " + error_json(message) + b"\n\n")
        if response is None:
            response = await self._open(request, 200)
        await response.write_eof()
        return response

    async def _open(self, request: web.Request, status: int) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers={"Content-Type": SSE_CONTENT_TYPE})
        await response.prepare(request)
        return response
