"""``pb_utils.Tensor``: a named tensor in CPU memory, from numpy or DLPack."""

from __future__ import annotations

from typing import Any

import numpy as np

from model_runtime.python_backend.dtypes import triton_of
from model_runtime.python_backend.pb_bridge import TritonModelException

__all__ = ["Tensor"]


class _DLPackCapsule:
    """Lets ``np.from_dlpack`` take a bare capsule (what ``torch.utils.dlpack.to_dlpack`` makes)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU: a capsule of another device is refused by numpy itself


class Tensor:
    """A named tensor in CPU memory (numpy; BYTES as object arrays of ``bytes``).

    Raises:
        TritonModelException: ``data`` is not a numpy array, or of a dtype Triton has none for.
    """

    __slots__ = ("_array", "_datatype", "_name")

    def __init__(self, name: str, data: Any, _datatype: str | None = None) -> None:
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                f"Tensor {name!r} needs a numpy array, not a {type(data).__name__}"
            )
        try:
            self._datatype = _datatype or triton_of(data.dtype)
        except ValueError as exc:
            raise TritonModelException(f"Tensor {name!r}: {exc}") from None
        self._name = str(name)
        self._array = data

    @classmethod
    def given(cls, name: str, array: np.ndarray, datatype: str) -> Tensor:
        """A tensor the instance made of what the daemon sent (its datatype checked there)."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> str:
        return self._datatype

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule over this tensor's memory (not for BYTES tensors)."""
        if self._datatype == "BYTES":
            raise TritonModelException(f"Tensor {self._name!r}: BYTES tensors have no DLPack form")
        return np.ascontiguousarray(self._array).__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor over a CPU, C-contiguous DLPack capsule or ``__dlpack__`` object."""
        source = capsule if hasattr(capsule, "__dlpack__") else _DLPackCapsule(capsule)
        try:
            array = np.from_dlpack(source)
        except (TypeError, ValueError, BufferError, RuntimeError) as exc:
            raise TritonModelException(f"Tensor {name!r}: cannot take that DLPack: {exc}") from exc
        if not array.flags.c_contiguous:
            raise TritonModelException(f"Tensor {name!r}: DLPack tensors must be C-contiguous")
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._datatype}, {list(self._array.shape)})"
