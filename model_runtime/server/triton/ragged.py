"""Triton's ragged batching: inputs with ``allow_ragged_batch`` are batched without padding,
and ``batch_input`` tensors tell the model where each request's elements are.

A model with ragged batching takes each ragged input as one 1-dimensional tensor, the
concatenation of every request's elements in the batch, and each ``batch_input`` as a tensor
the server computes from the batch (Triton's kinds, per request in batch order):

- ``BATCH_ELEMENT_COUNT``: the elements of the source input in each request, shape [requests];
- ``BATCH_ACCUMULATED_ELEMENT_COUNT``: their running sum (where each request's elements end);
- ``BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO``: the same after a leading 0, [requests + 1];
- ``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE``: zeros shaped [the largest count];
- ``BATCH_ITEM_SHAPE``: each batch item's shape of the source (past the batch axis),
  [items, dims]; ``BATCH_ITEM_SHAPE_FLATTEN``: the same, flattened.

Other inputs are concatenated along their batch axis, and each output's batch axis is split back
over the requests by their batch sizes. The executable runs the model's own shapes (no batch
axis of ours); :class:`RaggedRunner` forms the batches: the requests that arrive within the
dynamic batcher's ``max_queue_delay_microseconds`` of the first, up to ``max_batch_size``
batch items, those whose other inputs have the same shape past the batch axis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from model_runtime.errors import ConfigurationError, InputValidationError
from model_runtime.sequences import SequenceStep
from model_runtime.server.serving import ServingRunner
from model_runtime.server.tensors.request import TensorSpec
from model_runtime.server.triton import model_config_pb2 as pb

if TYPE_CHECKING:
    from model_runtime.server.serving import RunnerLike

__all__ = ["BatchInput", "RaggedRunner", "RaggedSpec", "batch_input", "ragged_spec"]

_KIND = pb.BatchInput.Kind
_DTYPES: dict[int, type[np.generic]] = {
    pb.TYPE_INT32: np.int32,
    pb.TYPE_INT64: np.int64,
    pb.TYPE_FP32: np.float32,
}


@dataclass(frozen=True, slots=True)
class BatchInput:
    """One ``batch_input``: its kind, the model input it fills, its dtype and its source."""

    kind: int
    target: str
    dtype: type[np.generic]
    source: str


@dataclass(frozen=True, slots=True)
class RaggedSpec:
    """What a config's ragged batching asks: the ragged inputs, the batch inputs, the largest
    batch (items) and how long a batch waits to fill (seconds)."""

    ragged: frozenset[str]
    batch_inputs: tuple[BatchInput, ...]
    max_batch_size: int
    delay: float = 0.0
    targets: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", frozenset(b.target for b in self.batch_inputs))

    def model_specs(
        self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], where: object
    ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """The model's tensors as a batched model's (the batch axis first): a ragged input
        (1-dimensional in the model) gains one, the batch inputs are the server's.

        Raises:
            ConfigurationError: a batch input or ragged input the model does not take as
                1-dimensional, or another tensor without a variable first dimension.
        """
        by_name = {s.name: s for s in inputs}
        for target in sorted(self.targets):
            if target not in by_name:
                raise _fail(where, "batch_input", f"the model has no input {target!r}")
        served_inputs = []
        for s in inputs:
            if s.name in self.targets:
                continue
            if s.name in self.ragged:
                if len(s.shape) != 1:
                    raise _fail(
                        where, "allow_ragged_batch", f"the model's input {s.name!r} is "
                        f"{list(s.shape)}: a ragged input is 1-dimensional in the model",
                    )  # fmt: skip
                served_inputs.append(TensorSpec(s.name, s.datatype, (-1, -1), batched=True))
            else:
                served_inputs.append(_batched(s, where))
        return tuple(served_inputs), tuple(_batched(s, where) for s in outputs)

    def wrap(self, runner: RunnerLike) -> RaggedRunner:
        """``runner`` (the model's own shapes) behind the ragged batcher."""
        return RaggedRunner(runner, self)


def _batched(spec: TensorSpec, where: object) -> TensorSpec:
    if not spec.shape or spec.shape[0] != -1:
        raise _fail(
            where, "allow_ragged_batch", f"the model's tensor {spec.name!r} is "
            f"{list(spec.shape)}: with ragged batching its first dimension is the batch (-1)",
        )  # fmt: skip
    return TensorSpec(spec.name, spec.datatype, spec.shape, batched=True)


def _fail(where: object, field: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"{where}: {field}: {why}")


def ragged_spec(config: pb.ModelConfig, where: object) -> RaggedSpec | None:
    """The config's ragged batching (None: it has none).

    Raises:
        ConfigurationError: ragged batching without ``max_batch_size``, on a python or
            stateful model, a ``batch_output``, or a batch input that is not well formed;
            naming the field.
    """
    ragged = frozenset(t.name for t in config.input if t.allow_ragged_batch)
    if not ragged and not config.batch_input and not config.batch_output:
        return None
    if config.batch_output:
        raise _fail(where, "batch_output", "BATCH_SCATTER_WITH_INPUT_SHAPE is not supported")
    if config.max_batch_size <= 0:
        raise _fail(where, "allow_ragged_batch", "ragged batching needs max_batch_size > 0")
    if config.backend == "python":
        raise _fail(where, "allow_ragged_batch", "a python model is given each request whole")
    if config.HasField("sequence_batching"):
        raise _fail(where, "allow_ragged_batch", "not with sequence_batching")
    names = {t.name for t in config.input}
    batch_inputs = []
    for i, b in enumerate(config.batch_input):
        at = f"batch_input[{i}]"
        if len(b.target_name) != 1 or not b.target_name[0]:
            raise _fail(where, f"{at}.target_name", "give one target (a model input)")
        if b.target_name[0] in names:
            raise _fail(where, f"{at}.target_name", f"{b.target_name[0]!r} is a request input")
        if len(b.source_input) != 1 or b.source_input[0] not in names:
            raise _fail(where, f"{at}.source_input", f"give one of the inputs {sorted(names)}")
        if b.data_type not in _DTYPES:
            raise _fail(where, f"{at}.data_type", "TYPE_INT32, TYPE_INT64 or TYPE_FP32")
        batch_inputs.append(
            BatchInput(b.kind, b.target_name[0], _DTYPES[b.data_type], b.source_input[0])
        )
    delay = config.dynamic_batching.max_queue_delay_microseconds / 1e6
    return RaggedSpec(ragged, tuple(batch_inputs), config.max_batch_size, delay)


@dataclass(slots=True)
class _Pending:
    inputs: Mapping[str, np.ndarray]
    items: int
    key: tuple[object, ...]
    timeout: float | None
    priority: int
    future: asyncio.Future[dict[str, np.ndarray]]


class RaggedRunner(ServingRunner):
    """Forms ragged batches of the requests of one model version and runs each batch once on
    the wrapped runner (module docstring)."""

    __slots__ = ("_pending", "_running", "_timer", "spec")

    def __init__(self, runner: RunnerLike, spec: RaggedSpec) -> None:
        super().__init__(runner)
        self.spec = spec
        self._pending: list[_Pending] = []
        self._timer: asyncio.TimerHandle | None = None
        #: The batches running (the loop keeps only weak references to tasks).
        self._running: set[asyncio.Task[None]] = set()

    async def execute(  # type: ignore[override]
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        sequence: SequenceStep | None = None,
    ) -> dict[str, np.ndarray]:
        """This request's outputs, once the batch it joins has run.

        Raises:
            InputValidationError: output buffers, inputs of different batch sizes, or more
                batch items than ``max_batch_size``.
            ModelRuntimeError: whatever the wrapped runner raises for the batch.
        """
        if outputs is not None or sequence is not None:
            raise InputValidationError("a ragged model takes no output buffers or sequences")
        sizes = {int(a.shape[0]) for a in inputs.values() if a.ndim}
        if len(sizes) != 1:
            raise InputValidationError(f"the inputs have different batch sizes {sorted(sizes)}")
        (items,) = sizes
        if items > self.spec.max_batch_size:
            raise InputValidationError(
                f"batch size {items} is past the model's max_batch_size "
                f"({self.spec.max_batch_size})"
            )
        key = tuple(
            (n, a.dtype.str, a.shape[1:])
            for n, a in sorted(inputs.items())
            if n not in self.spec.ragged
        )
        loop = asyncio.get_running_loop()
        pending = _Pending(inputs, items, key, timeout, priority, loop.create_future())
        self._pending.append(pending)
        if sum(p.items for p in self._pending) >= self.spec.max_batch_size:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.spec.delay, self._flush)
        return await pending.future

    def _flush(self) -> None:
        """Run the next batch (the oldest request and those that fit with it)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending = [p for p in self._pending if not p.future.done()]  # cancelled
        if not self._pending:
            return
        first = self._pending[0]
        batch, rest, items = [], [], 0
        for p in self._pending:
            if p.key == first.key and items + p.items <= self.spec.max_batch_size:
                batch.append(p)
                items += p.items
            else:
                rest.append(p)
        self._pending = rest
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        if rest:
            self._timer = asyncio.get_running_loop().call_later(0, self._flush)

    async def _run(self, batch: list[_Pending]) -> None:
        try:
            inputs = self._model_inputs(batch)
            timeouts = [p.timeout for p in batch]
            timeout = None if None in timeouts else max(t for t in timeouts if t is not None)
            results = await self.current.execute(
                inputs, None, None, timeout, min(p.priority for p in batch)
            )
            split = self._split(batch, results)
        except Exception as exc:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        for p, outputs in zip(batch, split, strict=True):
            if not p.future.done():
                p.future.set_result(outputs)

    def _model_inputs(self, batch: Sequence[_Pending]) -> dict[str, np.ndarray]:
        spec = self.spec
        out: dict[str, np.ndarray] = {}
        for name in batch[0].inputs:
            arrays = [p.inputs[name] for p in batch]
            if name in spec.ragged:
                out[name] = np.concatenate([a.reshape(-1) for a in arrays])
            else:
                out[name] = np.concatenate(arrays, axis=0)
        for b in spec.batch_inputs:
            out[b.target] = batch_input(b, [p.inputs[b.source] for p in batch])
        return out

    @staticmethod
    def _split(
        batch: Sequence[_Pending], results: Mapping[str, np.ndarray]
    ) -> list[dict[str, np.ndarray]]:
        items = sum(p.items for p in batch)
        ends = np.cumsum([p.items for p in batch])[:-1]
        parts: list[dict[str, np.ndarray]] = [{} for _ in batch]
        for name, array in results.items():
            if not array.ndim or array.shape[0] != items:
                raise ConfigurationError(
                    f"output {name!r}: the model gave shape {list(array.shape)} for a ragged "
                    f"batch of {items} items (its first dimension is the batch)"
                )
            for part, piece in zip(parts, np.split(array, ends), strict=True):
                part[name] = piece
        return parts


def batch_input(b: BatchInput, sources: Sequence[np.ndarray]) -> np.ndarray:
    """One batch input's tensor for the requests' ``sources`` (the module docstring)."""
    counts = np.array([a.size for a in sources], dtype=np.int64)
    if b.kind == _KIND.BATCH_ELEMENT_COUNT:
        values = counts
    elif b.kind == _KIND.BATCH_ACCUMULATED_ELEMENT_COUNT:
        values = np.cumsum(counts)
    elif b.kind == _KIND.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        values = np.concatenate([[0], np.cumsum(counts)])
    elif b.kind == _KIND.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:
        values = np.zeros(int(counts.max()), dtype=np.int64)
    else:  # BATCH_ITEM_SHAPE(_FLATTEN): each batch item's shape past the batch axis
        values = np.array([a.shape[1:] for a in sources for _ in range(a.shape[0])], np.int64)
        if b.kind == _KIND.BATCH_ITEM_SHAPE_FLATTEN:
            values = values.reshape(-1)
    return values.astype(b.dtype)
