"""What a session does when a run fails: data errors bisected, device faults recovered by the
progress rule, a replica out of service probed until it serves again.

:class:`Recovery` builds on :class:`~actors.session.runs.DeviceRuns` (the classification is
the session actor's, in :mod:`.actor`'s docstring): :meth:`Recovery._bisect` finds the
requests whose data the backend rejects and answers everyone; :meth:`Recovery._recover`
resets the device once per fault (the reset generation) and says whether to retry;
:meth:`Recovery._fault` counts faults and takes the replica out of service past
``max_failed_recoveries``; :meth:`Recovery._probe_until_ready` brings it back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio
import numpy as np

from actors.device.messages import Reset
from actors.queues.batch import Batch
from actors.queues.messages import Settle
from actors.queues.request import Request
from actors.session import bisect
from actors.session.runs import DeviceRuns, Outputs
from actors.session.state import ReplicaStatus
from model_runtime.errors import (
    ActorStoppedError,
    ApplicationRuntimeError,
    DeviceStateError,
    ExecutionTimeoutError,
    InputValidationError,
    RecoverableRuntimeError,
    RecoveryAction,
    RuntimeFailure,
    UnrecoverableRuntimeError,
)
from model_runtime.executable.model import DYNAMIC_CHECK_SIZES

__all__ = ["Recovery", "is_resettable"]


def is_resettable(exc: BaseException) -> bool:
    """The seed's auto_reset rule: application errors and IPU_RESET recoverable errors."""
    if isinstance(exc, RecoverableRuntimeError):
        return exc.recovery_action is RecoveryAction.IPU_RESET
    return isinstance(exc, ApplicationRuntimeError)


class Recovery(DeviceRuns):
    """A session's answers to failed runs (see the module docstring)."""

    # -- data errors ------------------------------------------------------------------------------

    async def _bisect(self, batch: Batch, error: BaseException) -> None:
        """Find the requests whose data makes the run fail; answer everyone (module doc).

        Raises:
            RuntimeFailure, ExecutionTimeoutError, ActorStoppedError: a device fault during
                the bisection; the caller handles it as a failure of the whole batch.
        """
        t_start = self.clock.monotonic()
        live = [r for r in batch.requests if not r.future.done()]
        self.log.warning(
            "run_rejected_data", error=type(error).__name__, message=str(error), requests=len(live)
        )
        base = bisect.copy_inputs(batch)
        parts: list[tuple[Batch, Sequence[Mapping[str, np.ndarray]]]] = []
        rejected: list[tuple[Request, BaseException]] = []
        todo = [*bisect.halves(live)] if len(live) > 1 else [live]
        while todo:
            group = todo.pop()
            if not group:
                continue
            if len(live) == 1 and isinstance(error, InputValidationError):
                outputs: Outputs | None = None  # the whole batch already failed on its own
            else:
                outputs = await self._try_group(base, batch, group, error)
            if outputs is not None:
                parts.append((bisect.part(batch, group), outputs))
            elif len(group) > 1:
                todo.extend(bisect.halves(group))
            else:
                rejected.append((group[0], self._rejection(error)))
        self._state.poisoned += len(rejected)
        if len(rejected) < len(live):
            self._succeeded(t_start)
        self._finish(batch, Settle(batch, parts, rejected, t_start, self.clock.monotonic()))

    async def _try_group(
        self, base: bisect.Inputs, batch: Batch, group: list[Request], first: BaseException
    ) -> Outputs | None:
        """Run ``group``'s rows alone: their outputs, or None when they fail the same way."""
        inputs = bisect.masked_inputs(base, batch, group, self._layout)
        # A rejection by the backend (INVALID_ARGUMENT) is about the data for certain; an
        # application error may be a device fault that happened to strike twice, so a lone
        # request is convicted only when it fails as many times in a row as a batch is retried.
        tries = 1 + self._policy.max_retries if len(group) == 1 else 1
        for _ in range(tries):
            try:
                return await self._run_main(inputs)
            except InputValidationError:
                return None
            except ApplicationRuntimeError:
                if not isinstance(first, ApplicationRuntimeError):
                    raise
        return None

    def _rejection(self, error: BaseException) -> InputValidationError:
        cause = error.__cause__ or error
        rejection = InputValidationError(
            f"the model rejected this request's data on replica {self.replica}: {cause}"
        )
        rejection.__cause__ = error
        return rejection

    # -- device faults ----------------------------------------------------------------------------

    def _fault(self) -> bool:
        """Count a fault by the progress rule. False: the replica has left service."""
        state = self._state
        if state.fault_at is None:
            state.fault_at = self.clock.monotonic()
        state.faults += 1
        if state.recovering:
            state.failed_recoveries += 1
        state.recovering = True
        if state.failed_recoveries >= self._policy.max_failed_recoveries:
            self._leave_service(
                UnrecoverableRuntimeError(
                    f"replica {self.replica} made no progress through "
                    f"{state.failed_recoveries} recoveries in a row",
                    replica=self.replica,
                )
            )
            return False
        return True

    async def _recover(self, batch: Batch, exc: BaseException, generation: int) -> bool:
        """Reset the device if the policy says so. True: run the batch again.

        ``generation`` is the reset generation the failed run started in: when another batch's
        failure has reset the device since, this one is simply retried (one reset per fault).
        """
        hang = isinstance(exc, ExecutionTimeoutError)
        self.log.warning(
            "run_failed", error=type(exc).__name__, message=str(exc), attempts=batch.attempts
        )
        if isinstance(exc, UnrecoverableRuntimeError):
            self._fault()
            self._leave_service(exc)
            return False
        if not hang and not (self._policy.auto_reset and is_resettable(exc)):
            return False
        async with self._reset_lock:
            if self._state.status is ReplicaStatus.FAILED:
                return False
            if generation == self._generation:
                if not self._fault():
                    return False
                try:
                    await self.reset_device()
                except ActorStoppedError:
                    # The device actor died during the reset: its supervisor replaces it and,
                    # rest_for_one, this session; the batch stays in flight for the next one.
                    await anyio.sleep_forever()
                except (RuntimeFailure, ExecutionTimeoutError, DeviceStateError) as reset_exc:
                    self._leave_service(reset_exc)
                    return False
                self._generation += 1
        if not self._policy.auto_reset:
            # The seed's auto_reset=False: the error is raised. A hung device serves nobody,
            # so it was reset all the same, but the batch is not retried.
            return False
        batch.attempts += 1
        if batch.attempts <= self._policy.max_retries:
            self._state.retries += 1
            return True
        return False

    async def reset_device(self) -> None:
        """Reset the device, restoring the last saved variables; READY again when it is done.

        Raises:
            RuntimeFailure, ExecutionTimeoutError: the reset itself failed.
        """
        self._set_status(ReplicaStatus.RESETTING)
        self._state.resets += 1
        self.log.info("device_reset", resets=self._state.resets)
        await self._device.ask(
            Reset(self._state.saved_variables), timeout=self._policy.reset_timeout
        )
        self._set_status(ReplicaStatus.READY)

    def _leave_service(self, exc: BaseException) -> None:
        state = self._state
        if state.status is ReplicaStatus.FAILED:
            return
        state.failure = exc
        state.outages += 1
        # The backoff goes on growing while the replica flaps (back, then out again without
        # serving); a served batch resets it.
        state.probe_delay = state.probe_delay or self._policy.probe_initial
        self.log.error("replica_out_of_service", error=type(exc).__name__, message=str(exc))
        self._set_status(ReplicaStatus.FAILED)
        self._out.set()

    def _out_of_service_error(self) -> BaseException:
        return self._state.failure or UnrecoverableRuntimeError(
            f"replica {self.replica} is out of service", replica=self.replica
        )

    # -- coming back ------------------------------------------------------------------------------

    async def _warm_up(self) -> None:
        """Run one batch of zeros: proves the device runs the program; seeds the deadline.

        A model with variables is reset afterwards, to the last saved variables (or its
        initial ones), so the warm-up leaves no trace in its state.

        Raises:
            RuntimeFailure, ExecutionTimeoutError, InputValidationError, DeviceStateError:
                the run failed.
        """
        layout = self._layout
        # A dynamic dimension at the size the compiler verified the program with.
        inputs = [
            {
                s.name: np.zeros(
                    tuple(d if d >= 0 else DYNAMIC_CHECK_SIZES[0] for d in s.shape), s.dtype
                )
                for s in layout.inputs
            }
            for _ in range(layout.I)
        ]
        t_start = self.clock.monotonic()
        await self._run_main(inputs, probe=True)
        took = self.clock.monotonic() - t_start
        self._times.add(took)
        self._measure(took)
        if self._stateful:  # the zeros ran through the variables: put them back
            await self._device.ask(
                Reset(self._state.saved_variables), timeout=self._policy.reset_timeout
            )

    async def _probe_until_ready(self) -> None:
        """Out of service: reset and probe the device with exponential backoff until it runs.

        A device that cannot be reset (broken, detached) is re-attached: ``reattach`` replaces
        the Device actor and, rest_for_one, this session; the next one goes on probing.
        """
        state, policy = self._state, self._policy
        while True:
            delay = state.probe_delay or policy.probe_initial
            await self.clock.sleep(delay)
            state.probe_delay = min(delay * 2, policy.probe_cap)
            state.probes += 1
            state.heartbeat = self.clock.monotonic()
            try:
                await self._device.ask(Reset(state.saved_variables), timeout=policy.reset_timeout)
                await self._warm_up()
            except ActorStoppedError:
                # The device actor died: its supervisor replaces it and, rest_for_one, this
                # session, which goes on probing.
                await anyio.sleep_forever()
            except (UnrecoverableRuntimeError, DeviceStateError) as exc:
                self.log.warning("probe_failed", error=type(exc).__name__, reattach=True)
                if self._reattach is not None:
                    await self._reattach()
                continue
            except (RuntimeFailure, ExecutionTimeoutError, InputValidationError) as exc:
                self.log.warning("probe_failed", error=type(exc).__name__, message=str(exc))
                continue
            break
        state.failure = None
        state.failed_recoveries = 0
        state.recovering = False
        self.log.info("replica_back_in_service", probes=state.probes, outages=state.outages)
        self._set_status(ReplicaStatus.READY)
