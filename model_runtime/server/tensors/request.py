"""What a decoded inference request is, whichever wire it came over: the model's tensors as the
protocol describes them (:class:`TensorSpec`), the outputs a client asked for, the request
itself (:class:`InferRequest`), and the checks every codec applies to a declared shape and
datatype before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model_runtime.errors import ProtocolError
from model_runtime.sequences import SequenceStep
from model_runtime.server import answers
from model_runtime.server.answers import INT64_MAX
from model_runtime.server.tensors.datatypes import BYTES, DATATYPES
from model_runtime.server.tensors.shm import Lease
from model_runtime.server.tensors.shm_io import release

__all__ = [
    "MAX_DIM",
    "MAX_DIMS",
    "InferRequest",
    "RequestedOutput",
    "TensorSpec",
    "check_datatype",
    "check_shape",
    "element_count",
]


def _fail(message: str) -> ProtocolError:
    return ProtocolError(message)


#: More dimensions than this is refused (numpy's own limit is 64).
MAX_DIMS = 32
#: A dimension is an int64, as in Triton; an element count or byte size past it is refused in
#: Triton's words (:func:`element_count`).
MAX_DIM = INT64_MAX
#: Bytes an element of a BYTES array takes in numpy (an object: a pointer).
_OBJECT_ITEMSIZE = np.dtype(object).itemsize


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input or output as the protocol describes it (``-1``: any size); an
    output's class ``labels`` (its config's ``label_filename``), for classification."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    labels: tuple[str, ...] | None = field(default=None, compare=False, repr=False)
    #: whether dimension 0 is the batch (None: not known, then a leading -1 says so); a model
    #: without a batch axis may have a dynamic first dimension, which is no batch
    batched: bool | None = field(default=None, compare=False, repr=False)
    #: an input a request may leave out (the config's ``optional: true``)
    optional: bool = field(default=False, compare=False, repr=False)

    @property
    def has_batch_axis(self) -> bool:
        """Dimension 0 is the batch."""
        if self.batched is not None:
            return self.batched
        return bool(self.shape) and self.shape[0] == -1


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An output the client asked for, whether it wants it as binary data, how many classes
    it wants instead of the tensor (0: the tensor), and the part of a shared memory region it
    goes into instead of the response (None: the response)."""

    name: str
    binary: bool
    class_count: int = 0
    region: Lease | None = field(default=None, compare=False)


@dataclass(slots=True)
class InferRequest:
    """A decoded inference request. ``timeout`` (seconds, None: none given) and ``priority``
    (the protocol's level: 1 highest, 0 default) come from its checked ``parameters``."""

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: tuple[RequestedOutput, ...]
    parameters: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    priority: int = 0
    #: its place in a sequence (``sequence_id``...; None: none)
    sequence: SequenceStep | None = None
    #: the shared memory regions its inputs and outputs use, held until :meth:`release`
    leases: list[Lease] = field(default_factory=list)

    def release(self) -> None:
        """Give back the shared memory regions it holds (once it is answered)."""
        release(self.leases)


def check_shape(name: str, raw: Any) -> tuple[int, ...]:
    """Input ``name``'s shape: a list of at most :data:`MAX_DIMS` integers in
    [0, :data:`MAX_DIM`] (HTTP's JSON and gRPC's repeated int64 alike).

    Raises:
        ProtocolError: anything else.
    """
    if not isinstance(raw, list):
        raise _fail(f"input {name!r}: 'shape' must be a list of integers")
    if len(raw) > MAX_DIMS:
        raise _fail(f"input {name!r}: shape has {len(raw)} dimensions (at most {MAX_DIMS})")
    for d in raw:
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= MAX_DIM:
            raise _fail(f"input {name!r}: shape {raw} must hold integers in [0, {MAX_DIM}]")
    return tuple(raw)


def element_count(name: str, shape: tuple[int, ...], datatype: str) -> int:
    """The elements a checked shape of ``datatype`` holds (Python ints: nothing allocated).

    Raises:
        ProtocolError: the count, or its bytes, pass int64 (Triton's words).
    """
    n = 1
    for d in shape:
        n *= d  # Python ints: no overflow, and nothing is allocated
    if n > INT64_MAX:
        raise answers.element_count_overflow(name, shape)
    dtype = DATATYPES.get(datatype)
    if dtype is not None and n * dtype.itemsize > INT64_MAX:
        raise answers.byte_size_overflow(name, n, dtype.itemsize)
    if n == 0:  # numpy refuses an empty array whose other dimensions' bytes pass int64
        itemsize = _OBJECT_ITEMSIZE if dtype is None else dtype.itemsize
        nonzero = itemsize
        for d in shape:
            nonzero *= d or 1
        if nonzero > INT64_MAX:
            raise answers.empty_shape_overflow(name, shape, itemsize)
    return n


def check_datatype(name: str, datatype: Any, spec: TensorSpec, model: str) -> str:
    """The request's datatype of input ``name`` when it fits the model's (HTTP and gRPC).

    Raises:
        ProtocolError: not a string, unknown, BYTES where the model has none, or another.
    """
    if not isinstance(datatype, str):
        raise _fail(f"input {name!r}: 'datatype' must be a string")
    if datatype == BYTES and spec.datatype == BYTES:
        return datatype
    if datatype == BYTES:
        raise _fail(
            f"input {name!r}: datatype BYTES is not supported by model {model!r}, which has "
            f"no BYTES input ({name!r} is {spec.datatype})"
        )
    if datatype not in DATATYPES:
        known = ", ".join([*DATATYPES, BYTES])
        raise _fail(f"input {name!r}: unknown datatype {datatype!r} (known: {known})")
    if datatype != spec.datatype:
        raise _fail(
            f"input {name!r}: datatype {datatype} does not match the model's {spec.datatype}"
        )
    return datatype
