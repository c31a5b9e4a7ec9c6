"""What callers pass to and get from a runner: ``DataDesc`` and request validation.

Validation runs once per request on the event loop, so it is written to be cheap: a few dict
lookups and tuple comparisons per input, no copies. Arrays that are non-contiguous or read-only
are accepted as they are: the queue copies rows into its own batch buffers, so a caller's array
is never written and never aliased into a buffer that is later reused.

Requests share device batches, so whatever would fail while the queue packs a request's rows or
routes its outputs back would fail every request in that batch. Validation therefore refuses,
before anything is queued and to that caller only, everything the queue relies on: names,
dtypes, per-sample shapes, one sample count for all batched inputs, and output buffers of the
exact shape that the queue can write into (not read-only). Anchors without a batch dimension
(``batch_dim`` None) are unbatched, as in the queue: they are given whole, in the anchor's shape.

String inputs (``bytes`` anchors, numpy dtype ``object``) take numpy object arrays of ``bytes``
or ``str`` (encoded UTF-8), ``S``/``U`` arrays, or nested lists of those; every element is
checked (type, and valid UTF-8, which onnxruntime needs), so those models pay per element.
Outputs are object arrays of ``bytes``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_runtime.errors import InputValidationError, ResourceLimitError
from model_runtime.executable.limits import check_bytes
from model_runtime.executable.model import Anchor, ExecutableMetadata

__all__ = [
    "DataDesc",
    "RequestShape",
    "as_bytes_array",
    "check_batch_bytes",
    "describe_anchor",
    "validate_inputs",
    "validate_outputs",
]


@dataclass(frozen=True, slots=True)
class DataDesc:
    """Description of one input or output (seed: ``DataDesc``)."""

    name: str
    size_in_bytes: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    has_data: bool = False
    #: False for a tensor without a batch axis (given whole, at this shape)
    batched: bool = True


def describe_anchor(anchor: Anchor) -> DataDesc:
    """The :class:`DataDesc` of an anchor."""
    return DataDesc(
        name=anchor.name,
        size_in_bytes=anchor.tensor_info.size_in_bytes,
        shape=anchor.tensor_info.shape,
        dtype=anchor.tensor_info.dtype,
        has_data=anchor.has_data,
        batched=anchor.batch_dim is not None,
    )


@dataclass(frozen=True, slots=True)
class RequestShape:
    """Per-anchor facts validation needs, precomputed once per runner."""

    name: str
    axis: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]  # the executable's shape with the batch axis removed
    #: False for an anchor without a batch dimension: given whole, in the anchor's shape
    batched: bool = True
    #: a string (``bytes``) anchor: elements are checked and made ``bytes``
    strings: bool = False
    #: the names of ``shape``'s dynamic dimensions (``-1`` there; ``""`` where fixed), or
    #: ``()`` when every dimension is fixed
    dim_names: tuple[str, ...] = ()


def request_shapes(
    anchors: tuple[Anchor, ...], batching_dim: int | None, *, where: str
) -> tuple[RequestShape, ...]:
    """Precompute validation facts for ``anchors``.

    Raises:
        InputValidationError: ``batching_dim`` is beyond an anchor's rank.
    """
    out = []
    for a in anchors:
        shape = a.tensor_info.shape
        strings = a.tensor_info.dtype.kind == "O"
        if a.batch_dim is None:  # the queue's rule too (actors/queues/pool.py)
            out.append(
                RequestShape(
                    a.name,
                    0,
                    a.tensor_info.dtype,
                    shape,
                    batched=False,
                    strings=strings,
                    dim_names=a.dim_names,
                )
            )
            continue
        axis = batching_dim if batching_dim is not None else a.batch_dim
        if axis >= len(shape):
            raise InputValidationError(
                f"{where}: batching_dim {axis} is beyond the rank of {a.name!r} {list(shape)}"
            )
        out.append(
            RequestShape(
                a.name,
                axis,
                a.tensor_info.dtype,
                shape[:axis] + shape[axis + 1 :],
                strings=strings,
                dim_names=a.dim_names[:axis] + a.dim_names[axis + 1 :],
            )
        )
    return tuple(out)


def _fits(shape: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """``shape`` has ``want``'s rank and its size wherever ``want`` is not dynamic (-1)."""
    if len(shape) != len(want):
        return False
    return all(w < 0 or d == w for d, w in zip(shape, want, strict=True))


def _check_tied(s: RequestShape, shape: tuple[int, ...], sizes: dict[str, tuple[str, int]]) -> None:
    """Dynamic dimensions that share a name (a text model's ``seq`` on ``ids`` and ``mask``)
    take one size in a request."""
    for name, size in zip(s.dim_names, shape, strict=True):
        if not name:
            continue
        seen = sizes.setdefault(name, (s.name, size))
        if seen[1] != size:
            raise InputValidationError(
                f"input {s.name!r} has {size} along its dimension {name!r} but input "
                f"{seen[0]!r} has {seen[1]}: they must agree"
            )


def validate_inputs(
    inputs: Mapping[str, Any],
    shapes: tuple[RequestShape, ...],
    batch_size: int,
    dynamic: bool,
) -> tuple[dict[str, np.ndarray], int]:
    """Check a request's inputs; return them as arrays and the number of samples.

    A model whose inputs are all unbatched takes one batch (``batch_size`` samples) per request.

    Raises:
        InputValidationError: unknown or missing names, wrong dtype or shape, batched inputs
            that disagree on their number of samples, an empty request, or (without dynamic
            batching) a sample count that is not a multiple of the batch size. The message
            names the input at fault.
    """
    if not isinstance(inputs, Mapping):
        raise InputValidationError(f"inputs must be a mapping of name -> array, got {type(inputs)}")
    if len(inputs) != len(shapes):
        raise _name_mismatch(inputs, shapes)
    arrays: dict[str, np.ndarray] = {}
    samples = -1
    first = ""  # the input that set ``samples``
    tied: dict[str, tuple[str, int]] = {}  # dynamic dimension name -> (input, size)
    for s in shapes:
        try:
            value = inputs[s.name]
        except KeyError:
            raise _name_mismatch(inputs, shapes) from None
        if s.strings:
            arr = as_bytes_array(value, s.name)
        else:
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        if arr.dtype != s.dtype:
            raise InputValidationError(
                f"input {s.name!r} has dtype {arr.dtype}, the model expects {s.dtype}"
            )
        shape = arr.shape
        if not s.batched:
            if shape != s.shape and not (s.dim_names and _fits(shape, s.shape)):
                raise InputValidationError(
                    f"input {s.name!r} has shape {list(shape)}, the model expects "
                    f"{list(s.shape)} (it has no batch dimension: give it whole"
                    + ("; -1: any size)" if s.dim_names else ")")
                )
            if s.dim_names:
                _check_tied(s, shape, tied)
            arrays[s.name] = arr
            continue
        rest = shape[: s.axis] + shape[s.axis + 1 :]
        if s.dim_names and len(shape) == len(s.shape) + 1 and _fits(rest, s.shape):
            _check_tied(s, rest, tied)
        elif len(shape) != len(s.shape) + 1 or rest != s.shape:
            expected = list(s.shape)
            expected.insert(s.axis, -1)
            raise InputValidationError(
                f"input {s.name!r} has shape {list(shape)}, the model expects "
                f"{expected} (-1: samples along dimension {s.axis}"
                + (", or any size)" if s.dim_names else ")")
            )
        n = shape[s.axis]
        if samples < 0:
            samples, first = n, s.name
        elif n != samples:
            raise InputValidationError(
                f"input {s.name!r} has {n} samples but input {first!r} has {samples}: "
                f"every input of a request must carry the same number of samples "
                f"(along dimension {s.axis})"
            )
        arrays[s.name] = arr
    if not first:
        samples = batch_size  # nothing is batched: one request is one batch
    if samples <= 0:
        raise InputValidationError("a request must carry at least one sample")
    if not dynamic and samples % batch_size:
        raise InputValidationError(
            f"{samples} samples is not a multiple of the model's batch size {batch_size} "
            f"(set batching_dim to accept any number of samples)"
        )
    return arrays, samples


def as_bytes_array(value: Any, name: str) -> np.ndarray:
    """``value`` as an object array of UTF-8 ``bytes`` (``value`` itself when it is one).

    Raises:
        InputValidationError: an element is neither ``bytes`` nor ``str``, or is not UTF-8.
    """
    if not isinstance(value, np.ndarray):
        try:
            value = np.array(value, dtype=object)
        except ValueError as exc:  # ragged nesting
            raise InputValidationError(f"input {name!r}: {exc}") from None
    if value.dtype.kind == "S":  # numpy's fixed-size bytes (trailing NULs are numpy's loss)
        value = value.astype(object)
    elif value.dtype.kind not in "UO":
        raise InputValidationError(
            f"input {name!r} has dtype {value.dtype}, the model expects bytes (an object array "
            "of bytes or str)"
        )
    out: np.ndarray | None = None
    flat = value.reshape(-1)
    for i, v in enumerate(flat):
        if type(v) is bytes:
            b = v
        elif isinstance(v, str):
            b = v.encode("utf-8", "surrogatepass")
        elif isinstance(v, bytes | bytearray | memoryview):
            b = bytes(v)
        else:
            raise InputValidationError(
                f"input {name!r} element {i} is {type(v).__name__}, expected bytes or str"
            )
        try:
            b.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputValidationError(
                f"input {name!r} element {i} is not valid UTF-8 ({exc.reason} at byte "
                f"{exc.start}), which onnxruntime needs for its strings"
            ) from None
        if b is not v or value.dtype.kind != "O":
            if out is None:
                out = np.empty(value.shape, dtype=object)
                out.reshape(-1)[:i] = flat[:i]
            out.reshape(-1)[i] = b
        elif out is not None:
            out.reshape(-1)[i] = b
    return value if out is None else out


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

    Every output needs a writable numpy array of its dtype and of exactly the shape ``execute``
    would return (``samples`` along the batch axis; an unbatched output's own shape).

    Raises:
        InputValidationError: unknown/missing names, not an array, wrong dtype or shape, or a
            read-only buffer. The message names the output at fault.
    """
    if not isinstance(outputs, Mapping):
        raise InputValidationError(
            f"outputs must be a mapping of name -> array, got {type(outputs)}"
        )
    known = {s.name for s in shapes}
    if set(outputs) != known:
        raise InputValidationError(
            f"outputs must name exactly {sorted(known)}, got {sorted(outputs)}"
        )
    for s in shapes:
        buf = outputs[s.name]
        if not isinstance(buf, np.ndarray):
            raise InputValidationError(
                f"output buffer {s.name!r} must be a numpy array, got {type(buf).__name__}"
            )
        expected = (*s.shape[: s.axis], samples, *s.shape[s.axis :]) if s.batched else s.shape
        if s.dim_names:
            raise InputValidationError(
                f"output {s.name!r} has dynamic dimensions {list(expected)}: its shape is known "
                "only once it is computed, so it cannot be given as a buffer"
            )
        if buf.dtype != s.dtype or buf.shape != expected:
            raise InputValidationError(
                f"output buffer {s.name!r} is {buf.dtype}{list(buf.shape)}, "
                f"expected {s.dtype}{list(expected)}"
            )
        if not buf.flags.writeable:
            raise InputValidationError(
                f"output buffer {s.name!r} is read-only: results are written into it"
            )


def check_batch_bytes(
    arrays: Mapping[str, np.ndarray], shapes: tuple[RequestShape, ...], meta: ExecutableMetadata
) -> None:
    """A dynamic model's batch buffers are sized by the request's shape: refuse a request
    whose batch (``device_iterations`` x ``batch_size`` rows of its shape) would pass the
    allocation limit, before anything is allocated for it.

    Raises:
        InputValidationError: naming the bytes a batch of this shape needs and the limit.
        ConfigurationError: ``MODEL_RUNTIME_FLAGS`` does not parse.
    """
    rows = meta.batch_size * meta.device_iterations
    needed = 0
    for s in shapes:
        a = arrays[s.name]
        per_row = a.nbytes // max(a.shape[s.axis], 1) if s.batched else a.nbytes
        needed += per_row * (rows if s.batched else meta.device_iterations)
    try:
        check_bytes(needed, what="a batch of this request's shape")
    except ResourceLimitError as exc:
        raise InputValidationError(
            f"model {meta.model_name!r}: {exc} (shapes "
            f"{ {n: list(a.shape) for n, a in arrays.items()} }); send smaller tensors"
        ) from None
