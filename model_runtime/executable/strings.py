"""String constants: a ``bytes`` weight stored as two fixed-dtype tensors (DESIGN.md §4).

safetensors has no string dtype, and a string constant (class labels, a vocabulary) is data like
any other, so it does not stay inside a program payload. A weight anchor of dtype ``bytes`` with
``has_data`` (a *string constant*, format version :data:`STRINGS_FORMAT_VERSION` and later)
stores its ``n`` elements, in row-major order, in two tensors named by
:func:`string_tensor_names`:

* ``offsets``: ``uint64``, shape ``[n + 1]``; ``offsets[0] == 0``, non-decreasing, and
  ``offsets[n]`` is the length of ``bytes``. Element ``i`` is ``bytes[offsets[i]:offsets[i+1]]``.
* ``bytes``: ``uint8``, 1-d: the elements' bytes, one after the other (any bytes, not only UTF-8).

:func:`check_string_data` is the load-time check (nothing is sized from a count before it is
compared with a tensor already in memory, which the allocation limit bounded when it was read);
:func:`pack_strings` and :func:`unpack_strings` convert to and from the runtime's numpy object
arrays of ``bytes``. In a main program's payload a string constant is an initializer without
data at the weight sentinel, like a numeric weight (see :mod:`.validate`); onnxruntime cannot
take string tensors through ``add_external_initializers`` (``OrtValue`` holds no strings), so a
device puts the strings back into the graph with :func:`with_string_initializers` before it
creates its session.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from model_runtime.executable.model import Anchor

__all__ = [
    "STRINGS_PREFIX",
    "check_string_data",
    "pack_strings",
    "string_tensor_names",
    "unpack_strings",
    "with_string_initializers",
]

#: Every tensor of a string constant is named under this prefix.
STRINGS_PREFIX = "__strings__/"

_U64 = np.dtype(np.uint64)
_U8 = np.dtype(np.uint8)


def string_tensor_names(anchor_name: str) -> tuple[str, str]:
    """The names of the ``(offsets, bytes)`` tensors of string constant ``anchor_name``
    (distinct for distinct anchors: the suffixes differ in their last six characters)."""
    return (
        f"{STRINGS_PREFIX}{anchor_name}/offsets",
        f"{STRINGS_PREFIX}{anchor_name}/bytes",
    )


def pack_strings(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (any shape; ``bytes`` or ``str`` elements, ``str`` as UTF-8) as its
    ``(offsets, bytes)`` tensors.

    Raises:
        TypeError: an element is neither ``bytes`` nor ``str``.
    """
    items = [_as_bytes(v) for v in np.asarray(values, dtype=object).reshape(-1)]
    offsets = np.zeros(len(items) + 1, _U64)
    offsets[1:] = np.cumsum(np.array([len(b) for b in items], dtype=_U64))
    data = np.frombuffer(b"".join(items), _U8).copy()
    return offsets, data


def unpack_strings(offsets: np.ndarray, data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The object array of ``bytes`` that checked ``(offsets, bytes)`` tensors hold, of
    ``shape`` (a fresh array; call :func:`check_string_data` first).

    Raises:
        ValueError: ``offsets`` does not have one entry more than ``shape`` has elements.
    """
    raw = np.asarray(data).tobytes()
    bounds = np.asarray(offsets).tolist()
    out = np.empty(len(bounds) - 1, dtype=object)
    out[:] = [raw[a:b] for a, b in itertools.pairwise(bounds)]
    return out.reshape(shape)


def check_string_data(a: Anchor, tensors: Mapping[str, np.ndarray], fail: Any) -> None:
    """Check the ``(offsets, bytes)`` tensors of string constant ``a`` (module docstring).

    ``fail(what)`` builds the exception to raise; every message names the anchor.
    """
    offsets_name, bytes_name = string_tensor_names(a.name)
    offsets, data = tensors.get(offsets_name), tensors.get(bytes_name)
    what = f"anchor {a.name!r}: string constant"
    if offsets is None or data is None:
        missing = offsets_name if offsets is None else bytes_name
        raise fail(f"{what} has data but its tensor {missing!r} is missing")
    if data.dtype != _U8 or data.ndim != 1:
        raise fail(f"{what}: {bytes_name!r} is {data.dtype.name}{list(data.shape)}, not 1-d uint8")
    n = a.tensor_info.num_elements  # bounded by MAX_ANCHOR_ELEMENTS, checked before
    if offsets.dtype != _U64 or offsets.shape != (n + 1,):
        raise fail(
            f"{what} of {n} elements needs offsets uint64[{n + 1}], "
            f"{offsets_name!r} is {offsets.dtype.name}{list(offsets.shape)}"
        )
    if int(offsets[0]) != 0:
        raise fail(f"{what}: offsets start at {int(offsets[0])}, not 0")
    if n and not bool(np.all(offsets[1:] >= offsets[:-1])):
        first = int(np.argmax(offsets[1:] < offsets[:-1]))
        raise fail(
            f"{what}: offsets decrease at element {first} "
            f"({int(offsets[first])} -> {int(offsets[first + 1])})"
        )
    if int(offsets[-1]) != data.size:
        raise fail(f"{what}: offsets end at {int(offsets[-1])}, its bytes hold {data.size}")


def with_string_initializers(model: Any, values: Mapping[str, np.ndarray]) -> bytes:
    """``model`` (an ``onnx.ModelProto``, changed in place) serialized with each top-level
    initializer named in ``values`` replaced by a STRING initializer holding that value (an
    object array of ``bytes`` or ``str``; ``str`` as UTF-8) at the initializer's position.

    Raises:
        KeyError: ``values`` names no initializer of ``model``.
        TypeError: an element is neither ``bytes`` nor ``str``.
    """
    from onnx import TensorProto

    found = {t.name: t for t in model.graph.initializer if t.name in values}
    for name, value in values.items():
        tensor = found.get(name)
        if tensor is None:
            raise KeyError(f"the main program has no initializer {name!r}")
        arr = np.asarray(value, dtype=object)
        filled = TensorProto(name=name, data_type=TensorProto.STRING, dims=arr.shape)
        filled.string_data.extend(_as_bytes(v) for v in arr.reshape(-1))
        tensor.CopyFrom(filled)
    data: bytes = model.SerializeToString()
    return data


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"a string element must be bytes or str, not {type(value).__name__}")
