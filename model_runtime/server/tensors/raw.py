"""Triton's raw binary requests: ``Inference-Header-Content-Length: 0``, the body is the one input.

A client that sends a tensor's bytes and nothing else (``curl --data-binary @image.raw``) leaves
everything to the model's configuration, as Triton does (``InferenceRequest::Normalize`` in its
core): the model must have exactly one input; its shape is the configured one, with a batch of
1 in front when the model batches, and at most one variable dimension, whose size the body's
length decides; a BYTES input must have shape [1], and the whole body is its one element. Every
output is answered, as binary data. What does not fit is refused in Triton's words
(:mod:`model_runtime.server.answers`), and a body whose length is not a whole number of
elements is Triton's byte size mismatch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model_runtime.server import answers
from model_runtime.server.tensors.binary import from_binary
from model_runtime.server.tensors.datatypes import BYTES, DATATYPES
from model_runtime.server.tensors.request import (
    InferRequest,
    RequestedOutput,
    TensorSpec,
    element_count,
)

__all__ = ["parse_raw_request"]


def parse_raw_request(
    body: bytes | bytearray,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    *,
    model: str = "",
) -> InferRequest:
    """Decode a raw binary request's ``body`` for a model with ``inputs`` and ``outputs``
    (the input is a view of ``body``: keep it unchanged while in use).

    Raises:
        ProtocolError: the model has more than one input, its shape cannot be deduced (two
            variable dimensions; a BYTES input not of shape [1]), or the body's length does
            not fit it.
    """
    if len(inputs) != 1:
        raise answers.raw_input_count(1, len(inputs), model)
    (spec,) = inputs
    dims = spec.shape[1:] if spec.has_batch_axis else spec.shape
    variable = [i for i, d in enumerate(dims) if d == -1]
    if len(variable) > 1:
        raise answers.raw_input_two_dynamic(spec.name)
    lead = (1,) if spec.has_batch_axis else ()
    if spec.datatype == BYTES:
        if variable or element_count(spec.name, dims, BYTES) != 1:
            raise answers.raw_input_bytes_shape(spec.name)
        flat = np.empty(1, dtype=object)
        flat[0] = bytes(body)
        return _request(flat.reshape(lead + dims), spec, outputs)
    itemsize = DATATYPES[spec.datatype].itemsize
    fixed = element_count(spec.name, tuple(d for d in dims if d != -1), spec.datatype)
    shape = list(lead + dims)
    if variable:
        # Triton's integer division: a remainder is then a byte size mismatch, as below.
        shape[len(lead) + variable[0]] = len(body) // (fixed * itemsize) if fixed else 0
    expected = element_count(spec.name, tuple(shape), spec.datatype) * itemsize
    if len(body) != expected:
        raise answers.byte_size_mismatch(spec.name, model, expected, len(body))
    flat = from_binary(spec.name, spec.datatype, memoryview(body))
    return _request(flat.reshape(shape), spec, outputs)


def _request(array: np.ndarray, spec: TensorSpec, outputs: Sequence[TensorSpec]) -> InferRequest:
    return InferRequest(
        id=None,
        inputs={spec.name: array},
        outputs=tuple(RequestedOutput(s.name, True) for s in outputs),
    )
