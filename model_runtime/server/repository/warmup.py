"""A model's ``model_warmup`` samples, run at load before the model is ready (Triton's
warm-up): each sample ``count`` times (at least once) on every instance, in the order the config
lists them, each round one request to every instance at once. A sample that fails fails the
load, as in Triton.

A sample's inputs are ``[batch_size] + dims`` for a batched model (``dims`` alone without a
batch axis), of its ``data_type``, filled with zeros (empty strings for ``TYPE_STRING``),
random values (a fixed seed: every load warms up alike; ``TYPE_STRING`` gets zeros, as the
values of a string do not matter to a warm-up) or an ``input_data_file``'s bytes: a file in
the ``warmup`` folder beside the config (the model directory), the tensor's raw little-endian
elements, or for ``TYPE_STRING`` each element as a 4-byte little-endian length and its bytes
(Triton's serialised form). The samples are checked first, at parse time, by
:func:`model_runtime.server.triton.fields.check_fields`.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import structlog

from model_runtime.errors import ConfigurationError
from model_runtime.server.serving import RunnerLike, innermost
from model_runtime.server.tensors.datatypes import dtype_of
from model_runtime.server.triton import model_config_pb2 as pb
from model_runtime.server.triton.settings import ModelSettings
from model_runtime.server.triton.tensors import DATATYPES

__all__ = ["WARMUP_FOLDER", "warm_up", "warm_up_or_close"]

#: The folder of a model directory that holds its warm-up samples' data files.
WARMUP_FOLDER = "warmup"

_DATATYPE_NAMES = {value: name for name, value in DATATYPES.items()}

log = structlog.get_logger(__name__)


def _instances(runner: RunnerLike) -> list[int | None]:
    status = getattr(innermost(runner), "replica_status", None)
    count = len(status()) if callable(status) else 0
    return list(range(count)) if count else [None]


async def warm_up(runner: RunnerLike, settings: ModelSettings) -> int:
    """Run the warm-up samples of ``settings`` on every instance of ``runner`` (started, not
    serving yet); the number of requests it ran.

    Raises:
        ConfigurationError: a sample's data cannot be made (a missing or short file), or its
            run failed; names the config, the sample and the cause.
    """
    where = settings.source or settings.origin or "model config"
    config = settings.config
    instances = _instances(runner)
    ran = 0
    for i, sample in enumerate(config.model_warmup):
        at = f"{where}: model_warmup[{i}] {sample.name!r}"
        inputs = {
            name: _data(tensor, _batch(config, sample), settings.source, f"{at}: {name!r}")
            for name, tensor in sorted(sample.inputs.items())
        }
        for _ in range(max(1, sample.count)):
            why = await _round(runner, inputs, instances)
            if why is not None:
                raise ConfigurationError(f"{at}: the warm-up request failed: {why}") from why
            ran += len(instances)
    return ran


async def _round(
    runner: RunnerLike, inputs: dict[str, np.ndarray[Any, Any]], instances: list[int | None]
) -> Exception | None:
    """One request to every instance at once (a runner that picks the instance itself, a
    python model's least loaded one, spreads them too); the first failure, or None."""
    failed: list[Exception] = []

    async def one(instance: int | None) -> None:
        try:
            await runner.execute(inputs, replica_id=instance)
        except Exception as exc:
            failed.append(exc)

    async with anyio.create_task_group() as tg:
        for instance in instances:
            tg.start_soon(one, instance)
    return failed[0] if failed else None


async def warm_up_or_close(
    runner: RunnerLike, settings: ModelSettings, model: str, version: str
) -> None:
    """:func:`warm_up` for version ``version`` of ``model`` when its config has samples;
    ``runner`` is closed if the warm-up fails (or is cancelled).

    Raises:
        ConfigurationError: as :func:`warm_up`.
    """
    if not settings.config.model_warmup:
        return
    try:
        ran = await warm_up(runner, settings)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await runner.close()
        raise
    log.info("model_warmed_up", model=model, version=version, requests=ran)


def _batch(config: pb.ModelConfig, sample: pb.ModelWarmup) -> list[int]:
    return [max(1, sample.batch_size)] if config.max_batch_size > 0 else []


def _data(
    tensor: pb.ModelWarmup.Input, batch: list[int], source: Path | None, at: str
) -> np.ndarray[Any, Any]:
    shape = (*batch, *tensor.dims)
    datatype = _DATATYPE_NAMES.get(tensor.data_type)
    if datatype is None:
        raise ConfigurationError(f"{at}: data_type {tensor.data_type} is not served")
    count = int(np.prod(shape, dtype=np.int64))
    kind = tensor.WhichOneof("input_data_type")
    if datatype == "BYTES":
        if kind == "input_data_file":
            items = _strings(_read(tensor.input_data_file, source, at), count, at)
            return np.array(items, dtype=object).reshape(shape)
        return np.full(shape, b"", dtype=object)
    dtype = dtype_of(datatype)
    if kind == "input_data_file":
        raw = _read(tensor.input_data_file, source, at)
        size = count * dtype.itemsize
        if len(raw) < size:
            raise ConfigurationError(
                f"{at}: {tensor.input_data_file} holds {len(raw)} bytes, the input needs {size}"
            )
        return np.frombuffer(raw[:size], dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)
    if kind == "random_data":
        rng = np.random.default_rng(0)
        if dtype.kind == "f":
            return rng.random(shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, shape).astype(dtype)
        return rng.integers(0, 100, shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def _read(name: str, source: Path | None, at: str) -> bytes:
    if source is None:
        raise ConfigurationError(f"{at}: input_data_file needs the model's directory")
    path = source.parent / WARMUP_FOLDER / name
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"{at}: cannot read {path}: {exc.strerror or exc}") from exc


def _strings(raw: bytes, count: int, at: str) -> list[bytes]:
    items: list[bytes] = []
    offset = 0
    while len(items) < count:
        if offset + 4 > len(raw):
            raise ConfigurationError(f"{at}: the file holds {len(items)} strings, needs {count}")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise ConfigurationError(f"{at}: string {len(items)} runs past the file's end")
        items.append(raw[offset : offset + length])
        offset += length
    return items
