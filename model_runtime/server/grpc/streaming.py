"""The answers of one ``ModelStreamInfer`` request, as Triton's stream handler writes them
(``src/grpc/stream_infer_handler.cc``).

Each response is one ``ModelStreamInferResponse`` whose ``infer_response`` carries the
``triton_final_response`` parameter: false on each response of a decoupled model but its last,
true on the last (and on a model's one answer). A decoupled model that ends with the final flag
alone sends that flag as an empty response (its id, model name and version, and
``triton_final_response: true``) only when the request set
``triton_enable_empty_final_response``; otherwise nothing is sent for it. A model's error for a
response is that response's ``error_message`` and the stream goes on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from model_runtime.server.grpc.codec import encode_model_infer_response, parse_model_infer_request
from model_runtime.server.inference.plane import DataPlane
from model_runtime.server.inference.streaming import Reply, is_decoupled, replies
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.tensors.request import InferRequest
from model_runtime.server.triton import grpc_service_pb2 as pb

__all__ = ["EMPTY_FINAL", "FINAL", "stream_answers"]

#: The response parameter that says whether a response is a request's last.
FINAL = "triton_final_response"
#: The request parameter asking for the final flag as an empty response.
EMPTY_FINAL = "triton_enable_empty_final_response"


def _final(response: Any, final: bool) -> Any:
    response.parameters[FINAL].bool_param = final
    return response


def _set_parameter(response: Any, name: str, value: Any) -> None:
    param = response.parameters[name]
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = str(value)


def _header(request: Any) -> Any:
    return pb.ModelInferResponse(
        id=request.id, model_name=request.model_name, model_version=request.model_version
    )


def error_answer(request: Any, message: str, final: bool = True) -> Any:
    """The stream's answer to a failed response of ``request``."""
    return pb.ModelStreamInferResponse(
        error_message=message, infer_response=_final(_header(request), final)
    )


async def stream_answers(
    plane: DataPlane,
    request: Any,
    context: Any,
    one: Callable[[Any], Awaitable[Any]],
) -> AsyncGenerator[Any, None]:
    """The ``ModelStreamInferResponse`` messages answering ``request`` (see the module
    docstring); ``one(request)``: the ``ModelInferResponse`` of a model that answers once.

    Raises:
        ModelRuntimeError, HTTPError: what fails the request before its model answers (the
            caller answers it as the stream's error for the request).
    """
    entry = plane.entry(request.model_name, request.model_version)
    if not is_decoupled(entry):
        yield pb.ModelStreamInferResponse(infer_response=_final(await one(request), True))
        return
    # No front-end admission: how long a decoupled model's stream lasts is the model's to say
    # (a token stream), not work held in a queue.
    runner = plane.serving_runner(entry)
    parsed = parse_model_infer_request(
        request, entry.inputs, entry.outputs, model=entry.name, regions=plane.shared_memory
    )
    empty_final = request.parameters[EMPTY_FINAL].bool_param if (
        EMPTY_FINAL in request.parameters) else False  # fmt: skip
    try:
        async with aclosing(
            replies(plane, entry, runner, parsed, context.time_remaining())
        ) as stream:
            async for reply in stream:
                answer = _answer(request, entry, parsed, reply, empty_final)
                if answer is not None:
                    yield answer
    finally:
        parsed.release()


def _answer(
    request: Any, entry: ModelEntry, parsed: InferRequest, reply: Reply, empty_final: bool
) -> Any | None:
    """The message for one reply of a decoupled model (None: nothing is sent for it)."""
    if reply.error is not None:
        return error_answer(request, str(reply.error), reply.final)
    if reply.empty:
        if not empty_final:
            return None
        return pb.ModelStreamInferResponse(infer_response=_final(_header(request), True))
    wanted = dataclasses.replace(
        parsed, outputs=tuple(o for o in parsed.outputs if o.name in reply.outputs), leases=[]
    )
    response = encode_model_infer_response(
        entry.name, entry.version, wanted, reply.outputs, entry.datatypes, specs=entry.outputs
    )
    for name, value in reply.parameters.items():
        _set_parameter(response, str(name), value)
    return pb.ModelStreamInferResponse(infer_response=_final(response, reply.final))
