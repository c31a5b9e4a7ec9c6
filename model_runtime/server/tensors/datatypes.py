"""Tensor datatype names of the Open Inference Protocol v2 and their numpy dtypes.

The protocol names element types (``FP32``, ``INT64``, ``BOOL``, ``BYTES`` ...); the runtime
works with numpy dtypes. Binary tensor data is little-endian, row-major, ``BOOL`` one byte per
element, so every numeric dtype here is explicitly little-endian.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["BYTES", "DATATYPES", "datatype_of", "dtype_of"]

#: Variable-length byte strings: a model's string tensors (numpy object arrays of ``bytes``).
BYTES = "BYTES"

#: Protocol datatype name -> numpy dtype (little-endian), for every fixed-size element type.
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}

_BY_KIND_SIZE: dict[tuple[str, int], str] = {
    (dt.kind, dt.itemsize): name for name, dt in DATATYPES.items()
}


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The protocol datatype name of a numpy dtype (byte order ignored; ``object``, a string
    tensor, is ``BYTES``).

    Raises:
        ValueError: the dtype has no protocol equivalent (e.g. complex, structured).
    """
    if dtype.kind == "O":
        return BYTES
    try:
        return _BY_KIND_SIZE[(dtype.kind, dtype.itemsize)]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no Open Inference Protocol datatype") from None


def dtype_of(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of a protocol datatype name.

    Raises:
        KeyError: ``datatype`` is not a fixed-size protocol datatype (``BYTES`` included).
    """
    return DATATYPES[datatype]
