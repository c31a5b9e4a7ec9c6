"""The boundary between the shapes a client sees and the shapes the model runs: a Triton
config's ``reshape`` (the client sends and gets ``dims``, the model takes and gives
``reshape.shape``) and ``dims`` that narrow a variable dimension of the model.

A model that has neither gets no boundary: its requests go to the runner untouched (the hot
path of a fixed-shape model pays nothing). Otherwise :class:`BoundaryRunner` wraps its runner:
each request's arrays are checked against the config's ``dims`` and reshaped (a view, no
copy) before the runner sees them, and the answers are reshaped back. Variable dimensions
carry over in order, as Triton does: the i-th ``-1`` of ``dims`` gives the i-th ``-1`` of
``reshape.shape``, and back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from model_runtime.errors import ConfigurationError, InputValidationError
from model_runtime.sequences import SequenceStep
from model_runtime.server.serving import ServingRunner

if TYPE_CHECKING:
    from model_runtime.server.serving import RunnerLike

__all__ = ["Boundary", "BoundaryRunner", "Reshape"]


@dataclass(frozen=True, slots=True)
class Reshape:
    """One tensor across the boundary: ``dims`` as the client sends or gets it (past the
    batch axis; -1: any size), ``shape`` as the model takes or gives it (None: as ``dims``,
    which then only narrows what may be sent)."""

    name: str
    dims: tuple[int, ...]
    shape: tuple[int, ...] | None


def _carry(source: Sequence[int], actual: Sequence[int], target: Sequence[int]) -> list[int]:
    """``target`` with each -1 filled by the sizes ``actual`` has where ``source`` has -1."""
    values = iter([a for s, a in zip(source, actual, strict=True) if s == -1])
    return [next(values, -1) if t == -1 else t for t in target]


class Boundary:
    """Checks and reshapes requests and answers between the client's shapes and the model's.

    Raises:
        see :meth:`to_model` and :meth:`to_client`.
    """

    __slots__ = ("_batched", "_inputs", "_outputs")

    def __init__(
        self, inputs: Sequence[Reshape], outputs: Sequence[Reshape], *, batched: bool
    ) -> None:
        self._inputs = tuple(inputs)
        self._outputs = tuple(o for o in outputs if o.shape is not None)
        self._batched = batched

    def to_model(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A request's arrays as the model takes them (inputs it does not name unchanged).

        Raises:
            InputValidationError: an input's shape does not fit the config's ``dims``.
        """
        out = dict(arrays)
        lead = 1 if self._batched else 0
        for r in self._inputs:
            a = arrays.get(r.name)
            if a is None:
                continue  # left out: the codec or the runner names what is missing
            past = a.shape[lead:]
            if a.ndim != lead + len(r.dims) or any(
                d not in (-1, s) for d, s in zip(r.dims, past, strict=True)
            ):
                want = [-1, *r.dims] if lead else list(r.dims)
                raise InputValidationError(
                    f"input {r.name!r}: shape {list(a.shape)} does not match {want} (the "
                    "model config's dims; -1: any size)"
                )
            if r.shape is not None:
                out[r.name] = a.reshape(*a.shape[:lead], *_carry(r.dims, past, r.shape))
        return out

    def to_client(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's answers as the client gets them (in place; returns ``arrays``).

        Raises:
            ConfigurationError: an output the model gave cannot take the config's ``dims``.
        """
        lead = 1 if self._batched else 0
        for r in self._outputs:
            a = arrays.get(r.name)
            if a is None:
                continue
            assert r.shape is not None
            past = a.shape[lead:]
            try:
                if len(past) != len(r.shape):
                    raise ValueError(f"{len(past)} dimensions, not {len(r.shape)}")
                arrays[r.name] = a.reshape(*a.shape[:lead], *_carry(r.shape, past, r.dims))
            except ValueError as exc:
                raise ConfigurationError(
                    f"output {r.name!r}: the model gave shape {list(a.shape)}, which does not "
                    f"reshape from {list(r.shape)} to the config's dims {list(r.dims)}: {exc}"
                ) from None
        return arrays

    def wrap(self, runner: RunnerLike) -> BoundaryRunner:
        """``runner`` behind this boundary."""
        return BoundaryRunner(runner, self)


class BoundaryRunner(ServingRunner):
    """A runner whose requests and answers cross a :class:`Boundary`; everything else is the
    wrapped runner's (``current``, as any :class:`ServingRunner`'s)."""

    __slots__ = ("boundary",)

    def __init__(self, runner: RunnerLike, boundary: Boundary) -> None:
        super().__init__(runner)
        self.boundary = boundary

    async def execute(  # type: ignore[override]
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        sequence: SequenceStep | None = None,
    ) -> dict[str, np.ndarray]:
        """The wrapped runner's ``execute`` on the request as the model takes it, its answer
        as the client gets it. No ``await`` comes before the runner's own first step.

        Raises:
            InputValidationError: an input does not fit the config's ``dims``, or
                ``outputs`` (buffers) are given (their shapes would be the model's).
            ModelRuntimeError: whatever the runner raises.
        """
        if outputs is not None:
            raise InputValidationError(
                "output buffers cannot be given to a model whose config reshapes tensors"
            )
        model = self.boundary.to_model(inputs)
        if sequence is None:
            results = await self.current.execute(model, None, replica_id, timeout, priority)
        else:
            results = await self.current.execute(  # type: ignore[call-arg]
                model, None, replica_id, timeout, priority, sequence=sequence
            )
        return self.boundary.to_client(results)
