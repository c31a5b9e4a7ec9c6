"""What a python model's config promises, checked: a caller's inputs before they are queued
(to that caller only), the model's outputs before they are answered (to that request only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from model_runtime.errors import InputValidationError, PythonModelError
from model_runtime.io import DataDesc
from model_runtime.python_backend.config import PythonModelConfig, TensorConfig
from model_runtime.python_backend.dtypes import triton_of
from model_runtime.python_backend.messages import PyResponse

__all__ = ["check_inputs", "check_outputs", "describe", "output_dtypes"]


def _fits(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(
        d < 0 or s == d for s, d in zip(shape, dims, strict=True)
    )


def _datatype(array: np.ndarray) -> str:
    try:
        return triton_of(array.dtype)
    except ValueError:
        return str(array.dtype)


def check_inputs(config: PythonModelConfig, inputs: Mapping[str, np.ndarray]) -> None:
    """Raises: InputValidationError: an input the model does not have, one it needs that is
    missing, of another data type or shape, or batch sizes that differ or pass the maximum."""
    tensors = config.inputs
    if len(inputs) == len(tensors):  # the common case, at a glance: every input as configured
        mbs = config.max_batch_size
        batch = None
        for tensor in tensors:
            array = inputs.get(tensor.name)
            if type(array) is not np.ndarray or array.dtype != tensor.dtype:
                break
            shape = array.shape
            if mbs:
                if not shape or not 1 <= shape[0] <= mbs or batch not in (None, shape[0]):
                    break
                batch, shape = shape[0], shape[1:]
            if shape != tensor.dims:
                break  # or dims of any size (-1): looked at below
        else:
            return
    _check_inputs(config, inputs)


def _check_inputs(config: PythonModelConfig, inputs: Mapping[str, np.ndarray]) -> None:
    model = config.name
    known = {t.name: t for t in config.inputs}
    for name in inputs:
        if name not in known:
            raise InputValidationError(f"unexpected inference input '{name}' for model '{model}'")
    batch: int | None = None
    for tensor in config.inputs:
        array = inputs.get(tensor.name)
        if array is None:
            if tensor.optional:
                continue
            raise InputValidationError(f"input '{tensor.name}' is missing for model '{model}'")
        if not isinstance(array, np.ndarray):
            raise InputValidationError(f"input '{tensor.name}' must be a numpy array")
        datatype = _datatype(array)
        if datatype != tensor.datatype:
            raise InputValidationError(
                f"inference input '{tensor.name}' data-type is '{datatype}', but model "
                f"'{model}' expects '{tensor.datatype}'"
            )
        shape = tuple(array.shape)
        if config.max_batch_size:
            if not shape or not 1 <= shape[0] <= config.max_batch_size:
                raise InputValidationError(
                    f"input '{tensor.name}' of model '{model}': a batch of "
                    f"{shape[0] if shape else 0} is not within 1..{config.max_batch_size}"
                )
            if batch is not None and shape[0] != batch:
                raise InputValidationError(f"inputs of model '{model}' differ in batch size")
            batch, shape = shape[0], shape[1:]
        if not _fits(shape, tensor.dims):
            raise InputValidationError(
                f"unexpected shape for input '{tensor.name}' for model '{model}'. Expected "
                f"{list(tensor.dims)}, got {list(shape)}"
            )


def output_dtypes(config: PythonModelConfig) -> dict[str, np.dtype[Any]]:
    """Each configured output's numpy dtype, by name (what :func:`check_outputs` looks up)."""
    return {t.name: t.dtype for t in config.outputs}


def check_outputs(
    config: PythonModelConfig,
    response: PyResponse,
    dtypes: Mapping[str, np.dtype[Any]] | None = None,
) -> PyResponse:
    """The response, or an error response if an output is not of the config's data type
    (``dtypes``: :func:`output_dtypes` of ``config``, when the caller keeps it)."""
    if dtypes is None:
        dtypes = output_dtypes(config)
    for name, array in response.outputs.items():
        dtype = dtypes.get(name)
        if dtype is None or array.dtype == dtype:
            continue
        tensor = next(t for t in config.outputs if t.name == name)
        if _datatype(array) != tensor.datatype:
            error = PythonModelError(
                f"the model returned output '{name}' as {_datatype(array)}, but its config "
                f"says TYPE_{tensor.datatype}",
                "INTERNAL",
            )
            return PyResponse({}, error, response.parameters, response.final)
    return response


def describe(tensor: TensorConfig, max_batch_size: int) -> DataDesc:
    """The :class:`DataDesc` of a config tensor (-1: any size; the batch axis first)."""
    shape = (-1, *tensor.dims) if max_batch_size else tensor.dims
    size = 0
    if tensor.datatype != "BYTES" and all(d >= 0 for d in tensor.dims):
        size = int(np.prod(tensor.dims, dtype=np.int64)) * tensor.dtype.itemsize
    dtype: np.dtype[Any] = tensor.dtype
    return DataDesc(tensor.name, size, shape, dtype, batched=max_batch_size > 0)
