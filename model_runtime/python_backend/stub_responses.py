"""What a python model's responses become in a ``resp`` frame, in the instance process.

A response that cannot be sent (not an ``InferenceResponse``, outputs that are not ``Tensor``,
a dtype Triton has none for) becomes an error item. The outputs of the frame's responses are
stacked into one tensor per output when they agree (:mod:`.stacking`): each such item names
its row ``s`` of the frame's ``S`` tensors.

This module imports only numpy and its siblings, because the instance process runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from model_runtime.python_backend import pb_utils
from model_runtime.python_backend.stacking import stackable, stacked
from model_runtime.python_backend.wire import Desc, Encoder

__all__ = ["encode_response", "encode_responses"]

_Named = list[tuple[str, np.ndarray]]
_Response = pb_utils.InferenceResponse
_Tensor = pb_utils.Tensor


def _error_pair(error: pb_utils.TritonError) -> list[Any]:
    return [pb_utils.TritonError.CODE_NAMES[error.code()], error.message()]


def _outputs_of(
    response: pb_utils.InferenceResponse | None, requested: frozenset[str] | None
) -> dict[str, Any] | tuple[_Named, str]:
    """The outputs to send (and the parameters), or the item of an error response."""
    if response is None:
        return {}
    if not isinstance(response, pb_utils.InferenceResponse):
        return {
            "e": [
                "INTERNAL",
                f"expected a pb_utils.InferenceResponse, got a {type(response).__name__}",
            ]
        }
    error = response.error()
    if error is not None:
        if not isinstance(error, pb_utils.TritonError):
            return {"e": ["INTERNAL", str(error)]}
        return {"e": _error_pair(error), "p": response.parameters()}
    named: _Named = []
    for i, tensor in enumerate(response.output_tensors()):
        if not isinstance(tensor, pb_utils.Tensor):
            return {
                "e": [
                    "INTERNAL",
                    f"output {i} of the response is a "
                    f"{type(tensor).__name__}, not a pb_utils.Tensor",
                ]
            }
        if requested is None or tensor.name() in requested:
            named.append((tensor.name(), tensor.as_numpy()))
    return named, response.parameters()


def _item(enc: Encoder, named: _Named, params: str) -> dict[str, Any]:
    try:
        descs = enc.tensors(named)
    except ValueError as exc:
        return {"e": ["INVALID_ARG", f"an output cannot be sent: {exc}"]}
    return {"T": descs} if params == "{}" else {"T": descs, "p": params}


def encode_response(
    enc: Encoder,
    response: pb_utils.InferenceResponse | None,
    requested: frozenset[str] | None,
) -> dict[str, Any]:
    """The wire form of one response (its tensors placed by ``enc``)."""
    got = _outputs_of(response, requested)
    return got if isinstance(got, dict) else _item(enc, *got)


def encode_responses(
    enc: Encoder,
    items: list[tuple[int, Any, int]],
    requested: Mapping[int, frozenset[str] | None],
) -> tuple[list[dict[str, Any]], list[Desc] | None]:
    """The wire items of responses ``(key, response, flags)`` and the frame's stacked tensors
    (None: each item has its own)."""
    got: list[dict[str, Any] | tuple[_Named, str]] = []
    for key, response, _ in items:
        # the common response, read at once: a plain InferenceResponse of plain Tensors, no
        # error, every output wanted; anything else is looked at closely by _outputs_of
        if type(response) is _Response and response._error is None and requested.get(key) is None:
            plain: _Named | None = []
            for tensor in response._outputs:
                if type(tensor) is not _Tensor:
                    plain = None
                    break
                plain.append((tensor._name, tensor._array))  # type: ignore[union-attr]
            if plain is not None:
                got.append((plain, response._parameters))
                continue
        got.append(_outputs_of(response, requested.get(key)))
    sending = [i for i, g in enumerate(got) if not isinstance(g, dict)]
    together: list[Desc] | None = None
    if len(sending) > 1:
        named = [got[i][0] for i in sending]  # type: ignore[index]
        if stackable(named):
            try:
                together = enc.tensors(stacked(named))
            except ValueError:
                together = None
    out = []
    row = 0
    for (key, _, flags), g in zip(items, got, strict=True):
        if isinstance(g, dict):
            item = g
        elif together is not None:
            item = {"s": row} if g[1] == "{}" else {"s": row, "p": g[1]}
            row += 1
        else:
            item = _item(enc, *g)
        item["k"] = key
        item["fl"] = flags
        out.append(item)
    return out, together
