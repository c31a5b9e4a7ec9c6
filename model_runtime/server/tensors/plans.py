"""Requests decoded from the plan of one seen before: clients repeat their requests' framing.

A request decoded whole (:func:`~model_runtime.server.tensors.codec.parse_infer_request`) whose
every input is read straight from its data leaves a plan: each input's name, datatype, shape
and where its data lies, and what else it asked (id, outputs, parameters, timeout, priority).
The next request to the same model (the same tensors: not a reloaded model's) whose framing
is the same bytes is decoded from that plan, its data read as the first request's was:

- a binary request (:func:`binary_request`): the same JSON header, every input binary data of
  a fixed-size datatype; its tensors are views of the body, BOOL bytes and the binary size
  checked;
- a JSON request (:func:`json_request`): the same text once each ``"data":[...]`` array (flat)
  is emptied, every input's data numbers; each array is read by simdjson as the whole
  document's was, and a count or value the plain decoder must judge sends the request there.

Never planned: shared memory, BYTES or BOOL JSON data, sequence parameters. At most
:data:`MAX_PLANS` plans are kept (emptied when full). Nothing here raises for a request
it does not plan: it says None and the caller decodes it whole. Framing past
:data:`MAX_KEY_BYTES` is never planned (the plans' memory stays bounded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_runtime.server.tensors import jsontape
from model_runtime.server.tensors.binary import from_binary
from model_runtime.server.tensors.datatypes import DATATYPES
from model_runtime.server.tensors.jsonnumbers import Retry
from model_runtime.server.tensors.request import InferRequest, TensorSpec

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_PLANS",
    "Layout",
    "binary_request",
    "forget",
    "json_key",
    "json_request",
    "remember_binary",
    "remember_json",
]

#: Plans kept, all models together.
MAX_PLANS = 256
#: The longest framing planned (a header, or a JSON body's text outside its arrays): the
#: plans hold at most MAX_PLANS times this.
MAX_KEY_BYTES = 8 << 10
#: Where each input of a request lay, as the decoder read it: ``("binary", name, datatype,
#: shape, start, stop)`` (its bytes after the JSON header) or ``("numbers", name, datatype,
#: shape, count)`` (a JSON ``data`` array of numbers).
Layout = list[tuple[Any, ...]]
_DATA = b'"data":['
_NOT_READ = (ValueError, TypeError, RuntimeError, Retry)


@dataclass(frozen=True, slots=True)
class _Plan:
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    size: int  # binary bytes (a binary plan)
    layout: tuple[tuple[Any, ...], ...]
    template: InferRequest

    def request(self, arrays: dict[str, np.ndarray]) -> InferRequest:
        t = self.template
        params = dict(t.parameters) if t.parameters else {}
        return InferRequest(t.id, arrays, t.outputs, params, t.timeout, t.priority)


_PLANS: dict[tuple[str, bytes], _Plan] = {}
#: The plan last used, with its model and framing: a client repeating its request is matched
#: by comparing its framing's bytes (no key made, no hash).
_LAST: list[Any] = [None, None, None]


def forget() -> None:
    """Forget every plan (the next request of each framing is decoded whole)."""
    _PLANS.clear()
    _LAST[:] = (None, None, None)


def binary_request(
    model: str,
    header: bytes,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    binary: memoryview,
) -> InferRequest | None:
    """The request of JSON ``header`` and ``binary`` data from its plan (None: none).

    Raises:
        ProtocolError: BOOL data holds a byte other than 0 or 1.
    """
    plan = _planned(model, header)
    if plan is None or plan.inputs is not inputs or plan.outputs is not outputs:
        return None
    if plan.size != len(binary):
        return None
    arrays: dict[str, np.ndarray] = {}
    for _, name, datatype, shape, start, stop in plan.layout:
        if datatype == "BOOL":  # (its bytes are checked)
            arrays[name] = from_binary(name, datatype, binary[start:stop]).reshape(shape)
        else:  # the same view, made in one call (no slice, no reshape)
            arrays[name] = np.ndarray(shape, DATATYPES[datatype], binary, start)
    return plan.request(arrays)


def _planned(model: str, key: bytes) -> _Plan | None:
    """The plan of ``model``'s requests of ``key`` (their framing's bytes), the last one
    matched first (a client's requests repeat theirs)."""
    last = _LAST
    if key == last[1] and model == last[0]:
        plan: _Plan | None = last[2]
        return plan
    plan = _PLANS.get((model, key))
    if plan is not None:
        _LAST[:] = (model, key, plan)
    return plan


def json_key(body: bytes | bytearray) -> tuple[bytes, list[tuple[int, int]]] | None:
    """A JSON body's text with each flat ``"data":[...]`` array emptied, and where each
    array's text lies; None: no such array, or one that nests, or a body too large for
    :func:`~model_runtime.server.tensors.jsontape.load` (never planned)."""
    if len(body) > jsontape.MAX_TAPE_BYTES:
        return None
    spans: list[tuple[int, int]] = []
    pieces: list[bytes | bytearray] = []
    pos = 0
    while (at := body.find(_DATA, pos)) >= 0:
        lo = at + len(_DATA)
        hi = body.find(b"]", lo)
        if hi < 0 or body.find(b"[", lo, hi) >= 0:
            return None
        pieces.append(body[pos:lo])
        spans.append((lo, hi))
        pos = hi
    if not spans:
        return None
    pieces.append(body[pos:])
    return b"".join(pieces), spans


def json_request(
    model: str,
    key: tuple[bytes, list[tuple[int, int]]],
    body: bytes | bytearray,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
) -> InferRequest | None:
    """The JSON request ``body`` (its :func:`json_key`) from its plan (None: none, or data
    the plain decoder must read)."""
    skeleton, spans = key
    plan = _planned(model, skeleton)
    if plan is None or plan.inputs is not inputs or plan.outputs is not outputs:
        return None
    if len(spans) != len(plan.layout):
        return None
    arrays: dict[str, np.ndarray] = {}
    for (_, name, datatype, shape, count), (lo, hi) in zip(plan.layout, spans, strict=True):
        try:
            numbers = jsontape.numbers(body[lo - 1 : hi + 1], datatype)
            if numbers is None:
                return None
            arrays[name] = numbers.array(datatype, count).reshape(shape)
        except _NOT_READ:
            return None
    return plan.request(arrays)


def remember_binary(
    model: str,
    header: bytes,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    parsed: InferRequest,
    layout: Layout,
    size: int,
) -> None:
    """Keep the plan of ``parsed`` (decoded whole from ``header`` and ``size`` binary bytes)
    if every input of it was binary data of a fixed-size datatype."""
    if all(slot[0] == "binary" for slot in layout):
        _keep((model, header), inputs, outputs, parsed, layout, size)


def remember_json(
    model: str,
    key: tuple[bytes, list[tuple[int, int]]],
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    parsed: InferRequest,
    layout: Layout,
) -> None:
    """Keep the plan of ``parsed`` (decoded whole from the body of :func:`json_key` ``key``)
    if every input of it was a numbers array, one per emptied array, in order."""
    if len(key[1]) == len(layout) and all(slot[0] == "numbers" for slot in layout):
        _keep((model, key[0]), inputs, outputs, parsed, layout, 0)


def _keep(
    key: tuple[str, bytes],
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    parsed: InferRequest,
    layout: Layout,
    size: int,
) -> None:
    if parsed.leases or parsed.sequence is not None or len(layout) != len(parsed.inputs):
        return
    if len(key[1]) > MAX_KEY_BYTES:
        return
    if len(_PLANS) >= MAX_PLANS:
        forget()
    # Its own copy of what a caller may change, and none of the body (its inputs are views).
    template = InferRequest(
        parsed.id, {}, parsed.outputs, dict(parsed.parameters), parsed.timeout, parsed.priority
    )
    plan = _PLANS[key] = _Plan(inputs, outputs, size, tuple(layout), template)
    _LAST[:] = (key[0], key[1], plan)
