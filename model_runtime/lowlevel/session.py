"""The Session (seed ``model_runtime::Session``): one executable bound to one device.

Use it as ``async with Session(exe_or_paths, SessionConfig(...)) as s:``, or ``start()`` and
``close()`` from any tasks. It is a client of the runtime's tree: the device it is bound to is
run by that device's one Device actor, which the root's DeviceManager owns and every session on
the device shares; device work is ``async``.

Data crosses the boundary through bindings: callbacks (:mod:`.policies`), empty callbacks,
data stored in the executable, or queues (:meth:`create_queue_manager`). Load programs run
implicitly before the first main run after binding; unbinding runs the save programs.

Several sessions may bind the same :class:`AttachedDevice`; one executable is on it at a time.
When another session needs the device, this one's save programs run and it is unloaded; the
other is loaded and its load programs run (and back again later), as the seed's Session does.
Runs of sessions sharing a device never overlap.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import numpy as np

from actors.actor import ActorRef
from actors.device.manager import AttachedDevice, DeviceManager
from actors.device.messages import OpenDevice
from model_runtime.errors import DeviceStateError, InputValidationError
from model_runtime.executable import Executable
from model_runtime.executable.model import Anchor, ProgramKind
from model_runtime.lowlevel import bindings as b
from model_runtime.lowlevel._core import SessionCore
from model_runtime.lowlevel.errors import AnchorsNotConnectedError
from model_runtime.lowlevel.policies import (
    AnchorCallbackPolicy,
    AnchorCallbackPredicate,
    CallbackFactory,
    CallbackHandle,
    CallbackInfo,
    LaunchPolicy,
    SessionConfig,
)
from model_runtime.lowlevel.queue_manager import DEFAULT_QUEUE_TIMEOUT, QueueManager
from model_runtime.lowlevel.ring_size_multiplier_factory import RingSizeMultiplierProd
from supervisor import Runtime

__all__ = ["Session"]

Source = Executable | str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


class Session(SessionCore):
    """Links an executable to a device (see the module docstring).

    ``executable_or_paths``: an :class:`Executable`, or the file(s) to load it from (loaded
    here, hash checked per ``config.check_package_hash``). ``device_manager`` is used by
    ``LaunchPolicy.IMMEDIATE`` to attach a device (default: a new :class:`DeviceManager`).

    Raises:
        InvalidExecutableError: (constructor) the files are not a valid executable.
        PackageHashMismatchError: (constructor) the package hash does not match.
    """

    def __init__(
        self,
        executable_or_paths: Source,
        config: SessionConfig | None = None,
        *,
        device_manager: DeviceManager | None = None,
    ) -> None:
        self.config = config or SessionConfig()
        src = executable_or_paths
        self._exe = (
            src
            if isinstance(src, Executable)
            else Executable.load(src, check_package_hash=self.config.check_package_hash)
        )
        self._table = b.AnchorTable(self._exe.metadata, self.config.pred_tensor_data)
        self._manager = device_manager
        self._in: dict[str, b.Binding] = {}
        self._out: dict[str, b.Binding] = {}
        self._qm: QueueManager | None = None
        self._root: Runtime | None = None
        self._closed = False
        self._device: AttachedDevice | None = None
        self._ref: ActorRef[Any] | None = None
        self._owns_device = False
        self._on_device = False
        self._load_done = False
        self._frozen_loaded = False
        self._stopped = False
        self._lock = anyio.Lock()
        self._buffers: dict[tuple[str, int], np.ndarray] = {}
        self._zeros: dict[str, np.ndarray] = {}

    # -- lifetime ----------------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Open the session; with ``LaunchPolicy.IMMEDIATE`` attach a device and load.

        Raises:
            DeviceStateError: already started or closed.
            DeviceUnavailableError: no device could be attached per ``config.wait_config``.
            ModelRuntimeError: loading failed.
        """
        if self._root is not None or self._closed:
            raise DeviceStateError("session already started (or closed)")
        self._root = await Runtime.acquire()
        if self.config.policy is LaunchPolicy.IMMEDIATE:
            try:
                manager = self._manager or DeviceManager()
                device = await manager.get_device_for(self._exe, self.config.wait_config)
                self._owns_device = True
                try:
                    await self.bind_to_device(device)
                finally:
                    if self._device is None:
                        device.detach()
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        """Unload (running the save programs), disconnect queues, stop the device actor.

        Raises:
            ModelRuntimeError: the save programs failed (the session is closed anyway).
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self._device is not None:
                async with self._lock:
                    await self._unload_locked()
        finally:
            if self._qm is not None:
                self._qm.disconnect_all()
            root, self._root = self._root, None
            if root is not None:
                await root.release()

    # -- properties --------------------------------------------------------------------------

    @property
    def model(self) -> Executable:
        """The executable of this session (seed ``model()``)."""
        return self._exe

    @property
    def device(self) -> AttachedDevice | None:
        return self._device

    @property
    def is_stopped(self) -> bool:
        """True after :meth:`stop`, until :meth:`reload`."""
        return self._stopped

    @property
    def queue_manager(self) -> QueueManager | None:
        return self._qm

    # -- binding -----------------------------------------------------------------------------

    async def bind_to_device(self, device: AttachedDevice) -> None:
        """Bind to ``device`` and load the executable on it (unbinding any previous device).

        Raises:
            DeviceStateError: the session is not started, or ``device`` is detached.
            InputValidationError: ``device`` is not an AttachedDevice.
            ModelRuntimeError: loading failed.
        """
        root = self._check_open()
        if not isinstance(device, AttachedDevice):
            raise InputValidationError(f"expected an AttachedDevice, got {type(device).__name__}")
        if not device.is_attached:
            raise DeviceStateError(f"{device!r} is detached")
        async with self._lock:
            if self._device is device:
                return
            if self._device is not None:
                await self._unload_locked()
            # The device's one Device actor, shared by every session on it (the manager's).
            self._ref = await root.device_manager.ask(OpenDevice(device))
            self._device = device
            try:
                occ = b.occupancy(device)
                async with occ.lock:
                    await self._activate(occ, load=False)
            except BaseException:
                await self._release()
                raise

    async def unload_from_device(self) -> None:
        """Run the save programs (if loaded) and unload from the bound device.

        Raises:
            DeviceStateError: not bound.
            ModelRuntimeError: the save programs failed (the session is unloaded anyway).
        """
        self._check_bound()
        async with self._lock:
            await self._unload_locked()

    def stop(self) -> None:
        """Stop: no program runs until :meth:`reload`; queues are disconnected (blocked reads
        return dummy data). The device state is undefined after a stop."""
        self._stopped = True
        if self._qm is not None:
            self._qm.disconnect_all()

    async def reload(self) -> None:
        """Load the executable again on the bound device and run the load programs.

        Raises:
            DeviceStateError: not bound.
            AnchorsNotConnectedError: a load program's anchor has no binding.
            ModelRuntimeError: loading failed.
        """
        self._check_bound()
        async with self._lock:
            occ = self._occ()
            async with occ.lock:
                await self._take_device(occ)
                self._stopped = False
                await self._run_load(force=True)

    # -- programs ----------------------------------------------------------------------------

    async def run_load_programs(self) -> None:
        """Run the load programs: weights and variables from their bindings or stored data.

        Raises:
            DeviceStateError: not bound, or stopped.
            AnchorsNotConnectedError: an anchor of a load program has no binding.
            QueueTimeoutError: an input queue of a load anchor had no data in time.
            ModelRuntimeError: the device failed.
        """
        self._check_runnable()
        async with self._lock:
            occ = self._occ()
            async with occ.lock:
                await self._take_device(occ)
                await self._run_load()

    async def run_main_programs(self) -> list[dict[str, np.ndarray]]:
        """One main run (device iterations included): read every input from its binding, run,
        write every output to its binding. Returns the outputs of each iteration.

        Raises:
            DeviceStateError: not bound, or stopped.
            AnchorsNotConnectedError: a main-program input has no binding.
            QueueTimeoutError: an input queue had too little data (or an output queue too
                many unclaimed outputs) within the queue manager's timeout.
            InputValidationError: a callback gave data of the wrong shape or dtype.
            ModelRuntimeError: the device failed.
        """
        self._check_runnable()
        async with self._lock:
            return await self._run_main(None)

    async def run_save_programs(self) -> dict[str, np.ndarray]:
        """Run the save programs; the variables go to their bindings and are returned.

        Raises:
            DeviceStateError: not bound, or stopped.
            ModelRuntimeError: the device failed.
        """
        self._check_runnable()
        async with self._lock:
            return await self._run_save(None)

    async def run_programs(self, indices: Sequence[int]) -> list[Any]:
        """Run programs by index, in order, once each: a load program gives ``None``, a main
        program its outputs per iteration, a save program the variables.

        Raises:
            InputValidationError: an index the executable does not have (nothing runs).
            DeviceStateError, AnchorsNotConnectedError, QueueTimeoutError, ModelRuntimeError:
                as the ``run_*_programs`` methods.
        """
        programs = tuple(int(i) for i in indices)
        self._table.check_programs(programs)
        self._check_runnable()
        results: list[Any] = []
        async with self._lock:
            for pid in programs:
                kind = self._table.kinds[pid]
                if kind is ProgramKind.MAIN:
                    results.append(await self._run_main(pid))
                elif kind is ProgramKind.SAVE:
                    results.append(await self._run_save(pid))
                else:
                    occ = self._occ()
                    async with occ.lock:
                        await self._take_device(occ)
                        await self._run_load()
                    results.append(None)
        return results

    # -- anchors and callbacks -------------------------------------------------------------

    def get_input_anchors(self) -> list[Anchor]:
        """Every anchor the device reads (user inputs, weights, variables)."""
        return list(self._table.inputs)

    def get_user_input_anchors(self) -> list[Anchor]:
        """Inputs that need a user binding (no stored data, or its use is disabled)."""
        return list(self._table.user_inputs)

    def get_user_output_anchors(self) -> list[Anchor]:
        """Outputs that need a user binding (main outputs, variables saved)."""
        return list(self._table.outputs)

    def set_callback_for_anchor(self, anchor_handle: str, callback: CallbackHandle) -> None:
        """Bind ``callback`` to the anchor (by name or handle), both ways for a variable.

        Raises:
            InputValidationError: no such anchor, or ``callback`` is not callable.
        """
        if not callable(callback):
            raise InputValidationError(f"callback for {anchor_handle!r} is not callable")
        a = self._table.anchor(anchor_handle)
        if a in self._table.inputs:
            self._in[a.name] = b.UserCallback(callback)
        if a in self._table.outputs:
            self._out[a.name] = b.UserCallback(callback)

    def set_user_input_handler(
        self,
        factory: CallbackFactory,
        anchor_callback_predicate: AnchorCallbackPredicate | None = None,
        skip_connected: bool = False,
    ) -> None:
        """Bind input anchors per ``anchor_callback_predicate`` (default: the user input
        anchors get the factory's callback, the others are skipped). The factory returning
        ``None`` keeps an anchor's binding; ``skip_connected`` leaves connected anchors alone.

        Raises:
            InputValidationError: the predicate returned something not an AnchorCallbackPolicy.
            Exception: whatever ``factory`` raised.
        """
        user = set(self._table.user_inputs)
        self._handle(factory, anchor_callback_predicate, skip_connected, True, user)

    def set_user_output_handler(
        self,
        factory: CallbackFactory,
        anchor_callback_predicate: AnchorCallbackPredicate | None = None,
        skip_connected: bool = False,
    ) -> None:
        """As :meth:`set_user_input_handler`, for the output anchors.

        Raises:
            InputValidationError: the predicate returned something not an AnchorCallbackPolicy.
            Exception: whatever ``factory`` raised.
        """
        user = set(self._table.outputs)
        self._handle(factory, anchor_callback_predicate, skip_connected, False, user)

    def anchors_not_connected_to_callbacks(
        self, progs: Sequence[int] | None = None
    ) -> dict[int, list[Anchor]]:
        """Program id -> the anchors it transfers that have no binding (only programs with
        some); ``progs`` defaults to every program.

        Raises:
            InputValidationError: an unknown program id.
        """
        programs = tuple(self._table.kinds) if progs is None else tuple(int(p) for p in progs)
        self._table.check_programs(programs)
        missing: dict[int, list[Anchor]] = {}
        for pid in programs:
            lost = [a for a in self._table.reads(pid) if not self._connected_in(a)]
            lost += [a for a in self._table.writes(pid) if a.name not in self._out]
            if lost:
                missing[pid] = lost
        return missing

    def error_if_anchors_are_not_connected_to_callbacks(
        self, progs: Sequence[int] | None = None
    ) -> None:
        """Raise if any anchor of ``progs`` (default: all) has no binding.

        Raises:
            AnchorsNotConnectedError: naming each program and its anchors.
            InputValidationError: an unknown program id.
        """
        missing = self.anchors_not_connected_to_callbacks(progs)
        if missing:
            raise AnchorsNotConnectedError(
                {p: [a.name for a in anchors] for p, anchors in missing.items()}
            )

    def create_queue_manager(
        self,
        ring_buffer_size_multiplier: int | RingSizeMultiplierProd = 2,
        *,
        timeout: float = DEFAULT_QUEUE_TIMEOUT,
    ) -> QueueManager:
        """Create the session's QueueManager (replacing, and disconnecting, any previous one):
        a queue per user input and output anchor, bound to it.

        Raises:
            ConfigurationError: a multiplier below 1 or a bad ``timeout``.
        """
        qm = QueueManager(
            self._table.user_inputs,
            self._table.outputs,
            self._table.per_run,
            ring_buffer_size_multiplier,
            timeout=timeout,
        )
        if self._qm is not None:
            self._qm.disconnect_all()
        self._qm = qm
        for name, iq in qm.inputs.items():
            self._in[name] = b.QueueBound(iq)
        for name, oq in qm.outputs.items():
            self._out[name] = b.QueueBound(oq)
        return qm

    def _handle(
        self,
        factory: CallbackFactory,
        pred: AnchorCallbackPredicate | None,
        skip_connected: bool,
        inputs: bool,
        user: set[Anchor],
    ) -> None:
        table = self._in if inputs else self._out
        for a in self._table.inputs if inputs else self._table.outputs:
            if pred is None:
                policy = AnchorCallbackPolicy.BIND_USER_CB if a in user else None
            else:
                policy = pred(a)
                if not isinstance(policy, AnchorCallbackPolicy):
                    raise InputValidationError(
                        f"predicate returned {policy!r} for {a.name!r}, not an AnchorCallbackPolicy"
                    )
            if policy is None or policy is AnchorCallbackPolicy.SKIP_CB:
                continue
            connected = self._connected_in(a) if inputs else a.name in self._out
            if skip_connected and connected:
                continue
            if policy is AnchorCallbackPolicy.BIND_EMPTY_CB:
                table[a.name] = b.EMPTY
            else:
                cb = factory(CallbackInfo(a))
                if cb is not None:
                    table[a.name] = b.UserCallback(cb)
