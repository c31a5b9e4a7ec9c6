"""DeviceManager in one process: cpu devices shared by attachments (counted, the last detach
releases), exclusive ipu-model and ``exclusive`` cpu devices, least-loaded placement, wait
strategies on a fake clock (against a lock held from outside, as another process would), listing,
created ipu-model devices, bad input, and the DeviceManager actor."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from device_fixtures import tiny_exe

from actors.actor import ActorRef, Stop
from actors.clock import FakeClock
from actors.device import (
    Attach,
    AttachedDevice,
    DetachDevice,
    DeviceConstraints,
    DeviceManager,
    DeviceManagerActor,
    DeviceWaitConfig,
    DeviceWaitStrategy,
    ListDevices,
    parse_devices,
)
from actors.device.inventory import ipu_model_spec
from actors.device.locks import DeviceLock
from model_runtime.errors import ConfigurationError, DeviceNotFoundError, DeviceUnavailableError
from model_runtime.executable import Target

WAIT_10 = DeviceWaitConfig(DeviceWaitStrategy.WAIT_WITH_TIMEOUT, timeout=10, sleep_time=3)


def manager(
    tmp_path: Path, devices: str = "cpu:1x1", clock: FakeClock | None = None
) -> DeviceManager:
    return DeviceManager(parse_devices(devices), lock_dir=tmp_path, clock=clock)


async def settle(clock: FakeClock, sleepers: int) -> None:
    """Wait until ``sleepers`` tasks sleep on the fake clock (no real sleeping)."""
    while clock.sleepers < sleepers:
        await anyio.lowlevel.checkpoint()


def outside(tmp_path: Path, device_id: int = 0) -> DeviceLock:
    """The device's lock taken as another process would (its own open file description)."""
    lock = DeviceLock.try_acquire(tmp_path, device_id)
    assert lock is not None
    return lock


async def test_cpu_devices_are_shared_in_the_process_and_the_last_detach_releases(
    tmp_path: Path,
) -> None:
    a, b = manager(tmp_path), manager(tmp_path)  # two managers of one process: one count
    dev = await a.get_device()
    assert dev.id == 0 and dev.is_attached
    again = await b.get_device()  # no "no free device": shared
    assert again.id == 0 and again is not dev and again.is_attached
    pinned = await b.get_specific_device(0)
    assert [i.attachments for i in a.list_devices()] == [3]
    listing = a.list_devices()
    assert listing[0].holder is not None and listing[0].holder.pid == os.getpid()
    assert DeviceLock.try_acquire(tmp_path, 0) is None  # other processes: still exclusive
    dev.detach()
    dev.detach()  # idempotent per attachment: it does not give back another one's share
    assert a.attachments(0) == 2 and a.list_devices()[0].holder is not None
    assert again.is_attached and not dev.is_attached
    pinned.detach()
    assert a.list_devices()[0].holder is not None  # one attachment left holds the lock
    again.detach()
    assert a.list_devices()[0].holder is None and a.attachments(0) == 0
    outside(tmp_path).release()  # released: another process could attach it now
    async with await b.get_specific_device(0) as third:
        assert third.is_attached and b.attachments(0) == 1
    assert not third.is_attached and b.attachments(0) == 0


@pytest.mark.parametrize("devices", ["ipu-model:1x1", "cpu:1x1:exclusive"])
async def test_exclusive_devices_stay_exclusive_in_the_process(
    tmp_path: Path, devices: str
) -> None:
    a, b = manager(tmp_path, devices), manager(tmp_path, devices)
    dev = await a.get_device(kind=a.inventory[0].kind)
    mine = rf"no free device: held: 0 \(pid {os.getpid()}\)"
    with pytest.raises(DeviceUnavailableError, match=mine):
        await b.get_device()
    assert await b.try_get_device() is None
    with pytest.raises(DeviceUnavailableError):
        await b.get_specific_device(0)
    assert a.attachments(0) == 1
    dev.detach()
    async with await b.get_specific_device(0) as again:
        assert again.is_attached
    assert a.list_devices()[0].holder is None


async def test_a_device_held_by_another_process_is_not_shared(tmp_path: Path) -> None:
    held = outside(tmp_path)
    m = manager(tmp_path)
    with pytest.raises(DeviceUnavailableError, match=f"pid {os.getpid()}"):
        await m.get_device()
    assert await m.try_get_specific_device(0) is None and m.attachments(0) == 0
    held.release()
    async with await m.get_device() as dev:
        assert dev.id == 0


async def test_placement_takes_the_least_loaded_device(tmp_path: Path) -> None:
    m = manager(tmp_path, "cpu:2x1")
    devs = [await m.get_device() for _ in range(4)]  # 4 replicas on 2 devices: 2 + 2
    assert [d.id for d in devs] == [0, 1, 0, 1]
    assert [i.attachments for i in m.list_devices()] == [2, 2]
    devs[1].detach()
    devs[3].detach()  # device 1 is free again, device 0 has 2: the next goes to 1, then 1 again
    nxt = [await m.get_device_for(tiny_exe()), await m.get_device()]
    assert [d.id for d in nxt] == [1, 1]
    third = await m.get_device()  # 2 and 2: lowest id
    assert third.id == 0
    for d in [*devs, *nxt, third]:
        d.detach()
    assert [i.holder for i in m.list_devices()] == [None, None]
    held = outside(tmp_path, 0)  # device 0 held by another process: every attach goes to 1
    more = [await m.get_device() for _ in range(3)]
    assert [d.id for d in more] == [1, 1, 1]
    for d in more:
        d.detach()
    held.release()


async def test_a_shared_device_needs_no_wait_under_any_strategy(tmp_path: Path) -> None:
    clock = FakeClock()
    m = manager(tmp_path, clock=clock)
    first = await m.get_device()
    forever = DeviceWaitConfig(DeviceWaitStrategy.WAIT_FOREVER, sleep_time=15)
    for wait in (DeviceWaitConfig(), WAIT_10, forever):
        with anyio.fail_after(5):  # real-time guard only: it must not sleep on the fake clock
            dev = await m.get_device(wait_config=wait)
        assert dev.id == 0 and clock.sleepers == 0 and clock.monotonic() == 0
        dev.detach()
    first.detach()


async def test_wait_with_timeout_gets_the_device_when_released_in_time(tmp_path: Path) -> None:
    clock = FakeClock()
    waiter = manager(tmp_path, clock=clock)
    held = outside(tmp_path)
    got: list[AttachedDevice] = []
    async with anyio.create_task_group() as tg:

        async def wait() -> None:
            got.append(await waiter.get_device(wait_config=WAIT_10))

        tg.start_soon(wait)
        await settle(clock, 1)
        clock.advance(3)  # attempt 2 at t=3: still held
        await settle(clock, 1)
        assert not got
        held.release()
        clock.advance(3)  # attempt 3 at t=6: free
    assert got and got[0].is_attached and clock.monotonic() == 6
    got[0].detach()


async def test_wait_with_timeout_fails_after_the_timeout(tmp_path: Path) -> None:
    clock = FakeClock()
    waiter = manager(tmp_path, clock=clock)
    held = outside(tmp_path)
    errors: list[Exception] = []
    async with anyio.create_task_group() as tg:

        async def wait() -> None:
            try:
                await waiter.get_device(wait_config=WAIT_10)
            except DeviceUnavailableError as exc:
                errors.append(exc)

        tg.start_soon(wait)
        for _ in range(4):  # attempts at 3, 6, 9 and the last one at 10
            await settle(clock, 1)
            assert not errors
            clock.advance(clock.next_deadline() - clock.monotonic())
    assert clock.monotonic() == 10
    assert errors and "after waiting 10" in str(errors[0]) and "5 attempts" in str(errors[0])
    held.release()


async def test_wait_forever_waits_until_released_or_cancelled(tmp_path: Path) -> None:
    clock = FakeClock()
    waiter = manager(tmp_path, clock=clock)
    held = outside(tmp_path)
    forever = DeviceWaitConfig(DeviceWaitStrategy.WAIT_FOREVER, sleep_time=15)
    with anyio.move_on_after(5):  # real-time guard only; cancellation ends the wait
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter.get_device, 1, None, forever)
            for _ in range(100):
                await settle(clock, 1)
                clock.advance(15)
            tg.cancel_scope.cancel()
    assert clock.monotonic() == 1500
    got: list[AttachedDevice] = []
    async with anyio.create_task_group() as tg:

        async def wait() -> None:
            got.append(await waiter.get_device(1, None, forever))

        tg.start_soon(wait)
        await settle(clock, 1)
        held.release()
        clock.advance(15)
    assert got[0].is_attached
    got[0].detach()


async def test_bad_requests_are_typed_errors(tmp_path: Path) -> None:
    m = manager(tmp_path, "cpu:2x1")
    with pytest.raises(DeviceNotFoundError, match="no device 7"):
        await m.get_specific_device(7)
    assert await m.try_get_specific_device(7) is None
    with pytest.raises(DeviceNotFoundError, match="no device of 4 device"):
        await m.get_device(num_devices=4)
    assert await m.try_get_device(num_devices=4) is None
    with pytest.raises(ConfigurationError, match="num_devices"):
        await m.get_device(num_devices=0)
    ipus = DeviceManager([ipu_model_spec(0)], lock_dir=tmp_path)
    with pytest.raises(DeviceNotFoundError, match="remote buffers"):
        await ipus.get_device(constraints=DeviceConstraints(requires_remote_buffers_support=True))
    with pytest.raises(ConfigurationError, match="duplicate ids"):
        DeviceManager(parse_devices("cpu:1x1") * 2, lock_dir=tmp_path)


async def test_unusable_lock_dir_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigurationError, match=r"cannot be created.*MODEL_RUNTIME_DIR"):
        await manager(tmp_path / "file").get_device()
    with pytest.raises(ConfigurationError, match="cannot be created"):
        await manager(tmp_path / "file" / "sub").get_device()
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "ro"
        locked.mkdir(mode=0o500)
        with pytest.raises(ConfigurationError, match="not a writable directory"):
            await manager(locked).get_device()


async def test_ipu_models_and_hardware_version(tmp_path: Path) -> None:
    m = manager(tmp_path)
    assert m.hardware_version() == 0  # cpu only: "no IPU in the system"
    assert DeviceManager(parse_devices("ipu-model:1x1"), lock_dir=tmp_path).hardware_version() == 2
    dev = m.create_ipu_model_device(num_ipus=2, ipu_version=1)
    assert (dev.spec.kind, dev.spec.num_ipus, dev.spec.tiles_per_ipu) == ("ipu-model", 2, 1216)
    small = m.create_small_ipu_model_device()
    assert small.spec.tiles_per_ipu == 4 and small.spec.memory_bytes == 4 * 624 * 1024
    with pytest.raises(ConfigurationError, match="version 3"):
        m.create_ipu_model_device(ipu_version=3)
    ipu = await m.get_device_for(tiny_exe(target=Target("ipu-model", 1, 2, 4)))
    assert ipu.spec.kind == "ipu-model" and ipu.spec.tiles_per_ipu == 4
    cpu = await m.get_device_for(tiny_exe())
    assert cpu.spec.kind == "cpu" and cpu.lock is not None
    cpu.detach()


async def test_ipu_version_per_device_and_hardware_version_per_system(tmp_path: Path) -> None:
    # Seed: Device::ipuVersion() is "the architecture version of the IPU or -1 if unknown";
    # DeviceManager::ipuHardwareVersion() is the system's version, -1 if IPUs of unknown
    # architecture, 0 if no IPU at all.
    m = manager(tmp_path)
    async with await m.get_device() as cpu:
        assert cpu.ipu_version() == -1  # a cpu device is not an IPU: unknown, not 0
    assert m.hardware_version() == 0  # no IPU in the system
    assert m.create_ipu_model_device(ipu_version=1).ipu_version() == 1
    assert m.create_small_ipu_model_device().ipu_version() == 2
    mixed = [ipu_model_spec(0, ipu_version=1), ipu_model_spec(1, ipu_version=2)]
    assert DeviceManager(mixed, lock_dir=tmp_path).hardware_version() == -1
    ipus = DeviceManager(parse_devices("cpu:1x1,ipu-model:1x1"), lock_dir=tmp_path)
    assert ipus.hardware_version() == 2
    async with await ipus.get_specific_device(1) as ipu:
        assert ipu.ipu_version() == 2


async def test_try_get_device_for_a_model_is_none_where_get_raises(tmp_path: Path) -> None:
    m = manager(tmp_path)
    exe = tiny_exe()
    dev = await m.try_get_device_for(exe)
    assert dev is not None and dev.spec.kind == "cpu" and dev.is_attached
    shared = await m.try_get_device_for(exe)  # held by this process: shared
    assert shared is not None and shared.id == dev.id
    dev.detach()
    shared.detach()
    held = outside(tmp_path)  # held by another process
    with pytest.raises(DeviceUnavailableError):
        await m.get_device_for(exe)
    assert await m.try_get_device_for(exe) is None
    held.release()
    two = tiny_exe(target=Target("cpu", 2))
    with pytest.raises(DeviceNotFoundError):
        await m.get_device_for(two)
    assert await m.try_get_device_for(two) is None  # no device of 2 in the inventory
    ipu = await m.try_get_device_for(tiny_exe(target=Target("ipu-model", 1, 1, 4)))
    assert ipu is not None and (ipu.ipu_version(), ipu.spec.tiles_per_ipu) == (1, 4)
    with pytest.raises(ConfigurationError, match="version 7"):  # bad input still raises
        await m.try_get_device_for(tiny_exe(target=Target("ipu-model", 1, 7, 4)))


async def test_specific_device_for_a_model_must_be_able_to_run_it(tmp_path: Path) -> None:
    m = manager(tmp_path, "cpu:1x1,ipu-model:1x1")
    cpu_exe, v2_exe = tiny_exe(), tiny_exe(target=Target("ipu-model", 1, 2, 4))
    async with await m.get_specific_device(0, cpu_exe) as dev:
        assert dev.id == 0 and dev.options == {}
        shared = await m.try_get_specific_device(0, cpu_exe)  # cpu: shared in the process
        assert shared is not None and shared.is_attached
        shared.detach()
    async with await m.get_specific_device(1, v2_exe, WAIT_10) as dev:
        assert dev.id == 1
        assert await m.try_get_specific_device(1, v2_exe) is None  # ipu-model: exclusive
    with pytest.raises(DeviceNotFoundError, match=r"device 0 \(cpu.*compiled for ipu-model"):
        await m.get_specific_device(0, v2_exe)
    assert await m.try_get_specific_device(0, v2_exe) is None
    v1_exe = tiny_exe(target=Target("ipu-model", 1, 1, 4))
    with pytest.raises(DeviceNotFoundError, match="compiled for IPU version 1"):
        await m.get_specific_device(1, v1_exe)
    with pytest.raises(DeviceNotFoundError, match=r"needs 2 device\(s\), this one has 1"):
        await m.get_specific_device(0, tiny_exe(target=Target("cpu", 2)))
    with pytest.raises(DeviceNotFoundError, match="no device 5"):
        await m.get_specific_device(5, cpu_exe)
    assert await m.try_get_specific_device(5, cpu_exe) is None


def test_ipu_model_devices_created_for_a_model(tmp_path: Path) -> None:
    m = manager(tmp_path)
    v1 = tiny_exe(target=Target("ipu-model", 2, 1, 0))
    dev = m.create_ipu_model_device(v1)  # size and version from the model, default tiles
    assert (dev.spec.num_ipus, dev.ipu_version(), dev.spec.tiles_per_ipu) == (2, 1, 1216)
    assert dev.lock is None and dev.id == -1
    assert m.create_ipu_model_device(v1, tiles_per_ipu=8).spec.tiles_per_ipu == 8
    tiled = tiny_exe(target=Target("ipu-model", 1, 2, 16))
    assert m.create_ipu_model_device(tiled).spec.tiles_per_ipu == 16  # the model's tiles
    small = m.create_small_ipu_model_device(v1)
    assert (small.spec.num_ipus, small.ipu_version(), small.spec.tiles_per_ipu) == (2, 1, 4)
    for create in (m.create_ipu_model_device, m.create_small_ipu_model_device):
        with pytest.raises(ConfigurationError, match="compiled for cpu, which names no IPU"):
            create(tiny_exe())
        with pytest.raises(ConfigurationError, match="a model or an ipu_version, not both"):
            create(v1, 2)  # type: ignore[call-overload]


async def test_device_manager_actor_answers_while_an_attach_waits(tmp_path: Path) -> None:
    clock = FakeClock()
    m = manager(tmp_path, "cpu:1x1:exclusive", clock=clock)
    held = outside(tmp_path)
    async with anyio.create_task_group() as tg:
        ref: ActorRef[object] = await tg.start(DeviceManagerActor(m, clock=clock).run)
        got: list[AttachedDevice] = []

        async def attach() -> None:
            got.append(await ref.ask(Attach(wait_config=WAIT_10)))

        tg.start_soon(attach)
        await settle(clock, 1)
        listing = await ref.ask(ListDevices())  # the mailbox is free while attach waits
        assert listing[0].holder.pid == os.getpid()
        held.release()
        clock.advance(3)
        while not got:
            await anyio.lowlevel.checkpoint()
        assert await ref.ask(Attach(try_only=True)) is None
        with pytest.raises(DeviceNotFoundError):
            await ref.ask(Attach(device_id=9))
        await ref.ask(DetachDevice(got[0]))
        assert not got[0].is_attached
        assert (await ref.ask(Attach(device_id=0))).is_attached
        await ref.ask(Stop())
