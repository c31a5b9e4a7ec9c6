"""What callers pass to and get from a runner: ``DataDesc`` and request validation.

Validation runs once per request on the event loop, so it is written to be cheap: a few dict
lookups and tuple comparisons per input, no copies. Arrays that are non-contiguous or read-only
are accepted as they are: the queue copies rows into its own batch buffers, so a caller's array
is never written and never aliased into a buffer that is later reused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_runtime.errors import InputValidationError
from model_runtime.executable.model import Anchor

__all__ = ["DataDesc", "RequestShape", "describe_anchor", "validate_inputs", "validate_outputs"]


@dataclass(frozen=True, slots=True)
class DataDesc:
    """Description of one input or output (seed: ``DataDesc``)."""

    name: str
    size_in_bytes: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    has_data: bool = False


def describe_anchor(anchor: Anchor) -> DataDesc:
    """The :class:`DataDesc` of an anchor."""
    return DataDesc(
        name=anchor.name,
        size_in_bytes=anchor.tensor_info.size_in_bytes,
        shape=anchor.tensor_info.shape,
        dtype=anchor.tensor_info.dtype,
        has_data=anchor.has_data,
    )


@dataclass(frozen=True, slots=True)
class RequestShape:
    """Per-anchor facts validation needs, precomputed once per runner."""

    name: str
    axis: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]  # the executable's shape with the batch axis removed


def request_shapes(
    anchors: tuple[Anchor, ...], batching_dim: int | None, *, where: str
) -> tuple[RequestShape, ...]:
    """Precompute validation facts for ``anchors``.

    Raises:
        InputValidationError: ``batching_dim`` is beyond an anchor's rank.
    """
    out = []
    for a in anchors:
        axis = batching_dim if batching_dim is not None else (a.batch_dim or 0)
        shape = a.tensor_info.shape
        if axis >= len(shape):
            raise InputValidationError(
                f"{where}: batching_dim {axis} is beyond the rank of {a.name!r} {list(shape)}"
            )
        out.append(
            RequestShape(a.name, axis, a.tensor_info.dtype, shape[:axis] + shape[axis + 1 :])
        )
    return tuple(out)


def validate_inputs(
    inputs: Mapping[str, Any],
    shapes: tuple[RequestShape, ...],
    batch_size: int,
    dynamic: bool,
) -> tuple[dict[str, np.ndarray], int]:
    """Check a request's inputs; return them as arrays and the number of samples.

    Raises:
        InputValidationError: unknown or missing names, wrong dtype or shape, inconsistent
            sample counts, an empty request, or (without dynamic batching) a sample count that
            is not a multiple of the batch size.
    """
    if not isinstance(inputs, Mapping):
        raise InputValidationError(f"inputs must be a mapping of name -> array, got {type(inputs)}")
    if len(inputs) != len(shapes):
        raise _name_mismatch(inputs, shapes)
    arrays: dict[str, np.ndarray] = {}
    samples = -1
    for s in shapes:
        try:
            value = inputs[s.name]
        except KeyError:
            raise _name_mismatch(inputs, shapes) from None
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        if arr.dtype != s.dtype:
            raise InputValidationError(
                f"input {s.name!r} has dtype {arr.dtype}, the model expects {s.dtype}"
            )
        shape = arr.shape
        if len(shape) != len(s.shape) + 1 or shape[: s.axis] + shape[s.axis + 1 :] != s.shape:
            expected = list(s.shape)
            expected.insert(s.axis, -1)
            raise InputValidationError(
                f"input {s.name!r} has shape {list(shape)}, the model expects "
                f"{expected} (-1: samples along dimension {s.axis})"
            )
        n = shape[s.axis]
        if samples < 0:
            samples = n
        elif n != samples:
            raise InputValidationError(
                f"inputs disagree on the number of samples: {s.name!r} has {n}, "
                f"others have {samples}"
            )
        arrays[s.name] = arr
    if samples <= 0:
        raise InputValidationError("a request must carry at least one sample")
    if not dynamic and samples % batch_size:
        raise InputValidationError(
            f"{samples} samples is not a multiple of the model's batch size {batch_size} "
            f"(set batching_dim to accept any number of samples)"
        )
    return arrays, samples


def _name_mismatch(
    inputs: Mapping[str, Any], shapes: tuple[RequestShape, ...]
) -> InputValidationError:
    known = {s.name for s in shapes}
    unknown = sorted(set(inputs) - known)
    missing = sorted(known - set(inputs))
    parts = [f"unknown {unknown}"] if unknown else []
    parts += [f"missing {missing}"] if missing else []
    return InputValidationError(
        f"inputs do not match the model: {', '.join(parts)} (expected {sorted(known)})"
    )


def validate_outputs(
    outputs: Mapping[str, np.ndarray], shapes: tuple[RequestShape, ...], samples: int
) -> None:
    """Check caller-provided output buffers for a request of ``samples`` samples.

    Raises:
        InputValidationError: unknown/missing names, wrong dtype, wrong shape, read-only buffer.
    """
    known = {s.name for s in shapes}
    if set(outputs) != known:
        raise InputValidationError(
            f"outputs must name exactly {sorted(known)}, got {sorted(outputs)}"
        )
    for s in shapes:
        buf = outputs[s.name]
        if not isinstance(buf, np.ndarray):
            raise InputValidationError(f"output {s.name!r} must be a numpy array")
        expected = (*s.shape[: s.axis], samples, *s.shape[s.axis :])
        if buf.dtype != s.dtype or buf.shape != expected:
            raise InputValidationError(
                f"output buffer {s.name!r} is {buf.dtype}{list(buf.shape)}, "
                f"expected {s.dtype}{list(expected)}"
            )
        if not buf.flags.writeable:
            raise InputValidationError(f"output buffer {s.name!r} is read-only")
