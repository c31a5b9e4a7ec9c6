"""What a Device's worker thread runs: backend calls under the reset generation and fault plan.

Every job is called with the generation it was submitted in and the abort event of that
generation. A job whose generation a reset has since voided fails with
:class:`~actors.device.backends.RunAborted`; on a broken device every job fails as
unrecoverable. The fault plan is applied to main runs (not probes) here, on the same path as a
real backend failure, and one-batch main runs are timed (what decides a run inline).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from actors.device.backends import Backend, RunAborted
from actors.device.faults import FaultInjector, FaultKind, FaultRule
from actors.device.messages import ProgramResult
from model_runtime.errors import (
    ApplicationRuntimeError,
    DeviceStateError,
    RecoverableRuntimeError,
    UnrecoverableRuntimeError,
)
from model_runtime.executable import Executable
from model_runtime.executable.model import ProgramKind

__all__ = ["DeviceCrash", "DeviceWork", "rows_of"]


class DeviceCrash(RuntimeError):
    """The fault plan's ``crash``: the Device actor dies of an unexpected exception."""


def rows_of(batch: Mapping[str, np.ndarray]) -> int:
    """The rows of one batch (its first tensor's leading dimension; 0 for scalars or none)."""
    for array in batch.values():
        return int(array.shape[0]) if array.ndim else 0
    return 0


class DeviceWork:
    """The worker-thread side of one device: its backend, generation, fault plan, run times.

    The Device actor owns it and changes ``generation`` (a reset), ``backend`` (a worker
    abandoned with its backend) and reads ``broken`` (set by a fatal fault) on the loop.
    """

    def __init__(
        self,
        backend: Backend,
        faults: FaultInjector | None,
        replica: int,
        what: Callable[[], str],
    ) -> None:
        self.backend = backend
        self.faults = faults
        self.replica = replica
        self.generation = 0
        self.broken: str | None = None
        #: Main runs of one batch: rows -> moving average of their seconds.
        self.run_seconds: dict[int, float] = {}
        self._what = what

    def guard(self, generation: int) -> None:
        """Raise unless a job of ``generation`` may still run on this device."""
        if generation != self.generation:
            raise RunAborted(f"{self._what()}: run aborted by a reset")
        if self.broken is not None:
            raise UnrecoverableRuntimeError(
                f"{self._what()} is broken: {self.broken}", replica=self.replica
            )

    def load(
        self,
        generation: int,
        abort: threading.Event,
        executable: Executable,
        frozen: Mapping[str, np.ndarray] | None,
        variables: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Load ``executable`` (its load programs run) and restore ``variables``, if given."""
        self.guard(generation)
        self.backend.load(executable, frozen)
        if variables:
            self.backend.restore_variables(variables)

    def unload(self, generation: int, abort: threading.Event) -> None:
        """Unload whatever the backend holds (also after a reset)."""
        self.backend.unload()

    def main(
        self,
        generation: int,
        abort: threading.Event,
        batches: Sequence[Mapping[str, np.ndarray]],
        probe: bool = False,
        into: Sequence[Mapping[str, np.ndarray]] | None = None,
    ) -> list[dict[str, np.ndarray]]:
        """One main run over ``batches`` (into ``into``'s buffers, if given)."""
        self.guard(generation)
        if self.faults is not None and not probe:
            rule = self.faults.next_run()
            if rule is not None:
                self._inject(rule, abort)
        t0 = time.perf_counter()
        if into is None:
            outputs = self.backend.run_main(batches)
        else:
            outputs = self.backend.run_main(batches, into)
        if len(batches) == 1:
            rows = rows_of(batches[0])
            took = time.perf_counter() - t0
            before = self.run_seconds.get(rows)
            self.run_seconds[rows] = took if before is None else before + (took - before) / 8
        return outputs

    def save(self, generation: int, abort: threading.Event) -> dict[str, np.ndarray]:
        """The save program's outputs (the variables)."""
        self.guard(generation)
        return self.backend.run_save()

    def programs(
        self,
        generation: int,
        abort: threading.Event,
        program_ids: Sequence[int],
        batches: Sequence[Mapping[str, np.ndarray]],
    ) -> list[ProgramResult]:
        """Run the executable's programs ``program_ids`` in order (mains over ``batches``)."""
        exe = self.backend.executable
        if exe is None:
            raise DeviceStateError(f"{self._what()}: no executable loaded")
        results: list[ProgramResult] = []
        for pid in program_ids:
            try:
                kind = exe.metadata.program(pid).kind
            except KeyError:
                raise DeviceStateError(
                    f"{self._what()}: the executable has no program {pid}"
                ) from None
            if kind is ProgramKind.LOAD:
                self.guard(generation)
                self.backend.run_load()
                results.append(None)
            elif kind is ProgramKind.MAIN:
                results.append(self.main(generation, abort, batches))
            else:
                results.append(self.save(generation, abort))
        return results

    def _inject(self, rule: FaultRule, abort: threading.Event) -> None:
        it = self.faults.iteration if self.faults is not None else 0
        where = f"{self._what()}: injected {rule.kind.value} fault at run {it}"
        match rule.kind:
            case FaultKind.RECOVERABLE:
                raise RecoverableRuntimeError(where, rule.action, replica=self.replica)
            case FaultKind.APP_ERROR:
                raise ApplicationRuntimeError(where, replica=self.replica)
            case FaultKind.FATAL:
                self.broken = where
                raise UnrecoverableRuntimeError(where, replica=self.replica)
            case FaultKind.HANG:
                abort.wait()
                raise RunAborted(f"{where}: released by a reset")
            case FaultKind.SLOW:
                if abort.wait(rule.seconds):
                    raise RunAborted(f"{where}: aborted by a reset")
            case FaultKind.CRASH:
                raise DeviceCrash(where)
