"""The Session's device side: activation on a shared device, load/main/save runs, and the
data path between bindings and the Device actor (see :mod:`.session`)."""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from actors.actor import ActorRef
from actors.device.manager import AttachedDevice
from actors.device.messages import (
    CloseDevice,
    LoadExecutable,
    RunMain,
    RunPrograms,
    RunSave,
    Unload,
)
from model_runtime.errors import ActorStoppedError, DeviceStateError
from model_runtime.executable import Executable
from model_runtime.executable.model import Anchor
from model_runtime.lowlevel import bindings as b
from model_runtime.lowlevel.errors import AnchorsNotConnectedError
from model_runtime.lowlevel.queue_manager import QueueManager
from model_runtime.lowlevel.queues import InputQueue, OutputQueue
from supervisor import Runtime

__all__ = ["SessionCore"]


class SessionCore(abc.ABC):
    """State and device-side internals of :class:`~model_runtime.lowlevel.session.Session`."""

    _exe: Executable
    _table: b.AnchorTable
    _in: dict[str, b.Binding]
    _out: dict[str, b.Binding]
    _qm: QueueManager | None
    _root: Runtime | None
    _closed: bool
    _device: AttachedDevice | None
    _ref: ActorRef[Any] | None
    _owns_device: bool
    _on_device: bool
    _load_done: bool
    _frozen_loaded: bool
    _stopped: bool
    _buffers: dict[tuple[str, int], np.ndarray]
    _zeros: dict[str, np.ndarray]

    @abc.abstractmethod
    def error_if_anchors_are_not_connected_to_callbacks(
        self, progs: tuple[int, ...] | None = None
    ) -> None:
        """Defined by :class:`~model_runtime.lowlevel.session.Session` (the public API)."""

    # -- internals: state --------------------------------------------------------------------

    def _check_open(self) -> Runtime:
        if self._root is None or self._closed:
            raise DeviceStateError("session not started (use `async with Session(...)`) or closed")
        return self._root

    def _check_bound(self) -> None:
        self._check_open()
        if self._device is None:
            raise DeviceStateError("session is not bound to a device: call bind_to_device()")

    def _check_runnable(self) -> None:
        self._check_bound()
        if self._stopped:
            raise DeviceStateError("session is stopped: call reload() first")

    def _occ(self) -> b.Occupancy:
        assert self._device is not None
        return b.occupancy(self._device)

    async def _ask(self, message: object) -> Any:
        if self._ref is None:
            raise DeviceStateError("session is not bound to a device")
        return await self._ref.ask(message)

    def _connected_in(self, anchor: Anchor) -> bool:
        return anchor.name in self._in or anchor.name in self._table.popef_fed

    def _needs_user_load(self) -> bool:
        load = self._exe.metadata.program_flow.load
        return any(
            a.name in self._in or a.name not in self._table.popef_fed
            for pid in load
            if pid in self._table.kinds
            for a in self._table.reads(pid)
        )

    async def _take_device(self, occ: b.Occupancy) -> None:
        """Make this session the device's active one (the other saves and unloads)."""
        other = occ.active
        if other is not None and other is not self:
            await other._deactivate(occ)
        occ.active = self

    async def _activate(self, occ: b.Occupancy, *, load: bool) -> None:
        if occ.active is self and self._on_device:
            return
        await self._take_device(occ)
        if load:
            await self._run_load()
        else:
            await self._ask(LoadExecutable(self._exe))
            self._on_device = True
            self._frozen_loaded = False
            self._load_done = not self._needs_user_load()

    async def _deactivate(self, occ: b.Occupancy) -> None:
        """Save (if loaded and running) and unload; called with ``occ.lock`` held."""
        try:
            if self._on_device and self._load_done and not self._stopped:
                await self._save_on_device(None)
        finally:
            if occ.active is self:
                occ.active = None
            if self._on_device:
                self._on_device = False
                self._load_done = False
                await self._ask(Unload())

    async def _run_load(self, *, force: bool = False) -> None:
        """Run the load programs (with ``occ.lock`` held and this session active)."""
        load = self._exe.metadata.program_flow.load
        self.error_if_anchors_are_not_connected_to_callbacks(load)
        frozen: dict[str, np.ndarray] = {}
        for a in {a.name: a for pid in load for a in self._table.reads(pid)}.values():
            binding = self._in.get(a.name)
            if binding is not None:
                frozen[a.name] = await self._input(a, binding, 0)
        if self._qm is not None:
            for name in frozen:
                if name in self._qm.inputs:
                    self._qm.inputs[name]._commit(1)
        if force or frozen or self._frozen_loaded or not self._on_device:
            await self._ask(LoadExecutable(self._exe, frozen or None))
        else:
            await self._ask(RunPrograms(load))
        self._frozen_loaded = bool(frozen)
        self._on_device = True
        self._load_done = True

    async def _ensure_ready(self, occ: b.Occupancy) -> None:
        await self._activate(occ, load=True)
        if not self._load_done:
            await self._run_load()

    async def _input(self, anchor: Anchor, binding: b.Binding, k: int) -> np.ndarray:
        match binding:
            case b.QueueBound(InputQueue() as q):
                assert self._qm is not None
                return await q._element(k, self._qm.timeout)
            case b.UserCallback(cb):
                buf = self._buffers.get((anchor.name, k))
                if buf is None:
                    buf = self._buffers[(anchor.name, k)] = np.zeros(anchor.shape, anchor.dtype)
                got = cb(buf)
                return buf if got is None else b.checked_input(anchor, got)
            case _:
                z = self._zeros.get(anchor.name)
                if z is None:
                    z = self._zeros[anchor.name] = b.zeros_like_anchor(anchor)
                return z

    def _output(self, anchor: Anchor, value: np.ndarray) -> None:
        match self._out.get(anchor.name):
            case b.QueueBound(OutputQueue() as q):
                q._write(value)
            case b.UserCallback(cb):
                cb(b.read_only(value))
            case _:
                pass

    async def _run_main(self, pid: int | None) -> list[dict[str, np.ndarray]]:
        main = self._exe.metadata.program_flow.main
        programs = main if pid is None else (pid,)
        reads = {a.name: a for p in programs for a in self._table.reads(p)}
        lost = {
            p: [a.name for a in self._table.reads(p) if not self._connected_in(a)] for p in programs
        }
        if any(lost.values()):
            raise AnchorsNotConnectedError({p: n for p, n in lost.items() if n})
        iterations = self._exe.metadata.device_iterations
        batches: list[dict[str, np.ndarray]] = []
        for k in range(iterations):
            batch = {}
            for a in reads.values():
                binding = self._in.get(a.name)
                batch[a.name] = (
                    self._exe.tensor(a.name)
                    if binding is None
                    else await self._input(a, binding, k)
                )
            batches.append(batch)
        writes = [a for p in programs for a in self._table.writes(p)]
        for a in writes:
            binding = self._out.get(a.name)
            if isinstance(binding, b.QueueBound) and isinstance(binding.queue, OutputQueue):
                assert self._qm is not None
                await binding.queue._wait_room(iterations, self._qm.timeout)
        # Stopped while this run waited for data: its queues were disconnected and fed it
        # dummy data, and it runs to its end as the seed's does ("feed dummy data to the
        # executable until it returns from its run()"); only later runs are refused.
        occ = self._occ()
        async with occ.lock:
            await self._ensure_ready(occ)
            if self._qm is not None:
                for name in reads:
                    if name in self._qm.inputs and isinstance(self._in.get(name), b.QueueBound):
                        self._qm.inputs[name]._commit(iterations)
            if pid is None:
                outputs: list[dict[str, np.ndarray]] = await self._ask(RunMain(tuple(batches)))
            else:
                outputs = (await self._ask(RunPrograms((pid,), tuple(batches))))[0]
        for result in outputs:
            for a in writes:
                if a.name in result:
                    self._output(a, result[a.name])
        return outputs

    async def _run_save(self, pid: int | None) -> dict[str, np.ndarray]:
        occ = self._occ()
        async with occ.lock:
            await self._ensure_ready(occ)
            return await self._save_on_device(pid)

    async def _save_on_device(self, pid: int | None) -> dict[str, np.ndarray]:
        if pid is None:
            values: dict[str, np.ndarray] = await self._ask(RunSave())
            programs = self._exe.metadata.program_flow.save
        else:
            values = (await self._ask(RunPrograms((pid,))))[0]
            programs = (pid,)
        for a in {a.name: a for p in programs for a in self._table.writes(p)}.values():
            if a.name in values:
                self._output(a, values[a.name])
        return values

    async def _unload_locked(self) -> None:
        try:
            occ = self._occ()
            async with occ.lock:
                if occ.active is self or self._on_device:
                    await self._deactivate(occ)
        finally:
            await self._release()

    async def _release(self) -> None:
        ref, device = self._ref, self._device
        self._ref = None
        self._device = None
        self._on_device = self._load_done = False
        if device is not None:
            occ = b.occupancy(device)
            if occ.active is self:
                occ.active = None
        if ref is not None and device is not None and self._root is not None:
            try:  # the device's shared actor: the last session on it stops it
                await self._root.device_manager.ask(CloseDevice(device))
            except ActorStoppedError:
                pass
        if device is not None and self._owns_device:
            device.detach()
