"""Exclusive attach across two real processes: NO_WAIT, WAIT_WITH_TIMEOUT (released in time
or not), a holder killed with SIGKILL whose device the waiter then gets, and a cpu device
shared by several attachments here that another process cannot attach until the last one
detaches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from actors.device import DeviceManager, DeviceWaitConfig, DeviceWaitStrategy, parse_devices
from model_runtime.errors import DeviceUnavailableError

pytestmark = pytest.mark.slow  # real processes, real clock

ROOT = Path(__file__).resolve().parents[2]
HOLDER = """
import asyncio, sys
import structlog
from actors.device import DeviceManager

structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

async def main() -> None:
    device = await DeviceManager().get_device()
    print(f"attached {device.id}", flush=True)
    sys.stdin.readline()
    device.detach()
    print("detached", flush=True)
    sys.stdin.readline()

asyncio.run(main())
"""
PROBE = """
import asyncio, sys
from actors.device import DeviceManager

async def main() -> None:
    for _ in sys.stdin:
        device = await DeviceManager().try_get_device()
        if device is not None:
            device.detach()  # let go before answering: "got" means it is free again
        print("got" if device is not None else "held", flush=True)

asyncio.run(main())
"""


def child_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, MODEL_RUNTIME_DIR=str(tmp_path), MODEL_RUNTIME_DEVICES="cpu:1x1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that has attached the only device (and waits for a line to detach)."""
    env = child_env(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "attached 0"  # ready: it holds the device
    yield proc
    proc.kill()
    proc.wait()


def mine(tmp_path: Path) -> DeviceManager:
    return DeviceManager(parse_devices("cpu:1x1"), lock_dir=tmp_path)


def say(proc: subprocess.Popen[str], line: str = "go") -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


async def test_no_wait_fails_at_once_and_names_the_holder(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    m = mine(tmp_path)
    start = time.monotonic()
    with pytest.raises(DeviceUnavailableError, match=f"pid {holder.pid}"):
        await m.get_device()
    assert time.monotonic() - start < 0.5
    (info,) = m.list_devices()
    assert info.holder is not None and info.holder.pid == holder.pid


async def test_wait_with_timeout_gets_the_device_when_the_other_detaches(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    wait = DeviceWaitConfig(DeviceWaitStrategy.WAIT_WITH_TIMEOUT, timeout=20, sleep_time=0.02)
    async with anyio.create_task_group() as tg:
        got = []

        async def attach() -> None:
            got.append(await mine(tmp_path).get_device(wait_config=wait))

        tg.start_soon(attach)
        say(holder)  # detach now; the waiter is retrying meanwhile
        assert holder.stdout is not None
        assert (await anyio.to_thread.run_sync(holder.stdout.readline)).strip() == "detached"
    assert got[0].is_attached
    (info,) = mine(tmp_path).list_devices()
    assert info.holder is not None and info.holder.pid == os.getpid()
    got[0].detach()


async def test_wait_with_timeout_fails_after_the_timeout(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    wait = DeviceWaitConfig(DeviceWaitStrategy.WAIT_WITH_TIMEOUT, timeout=0.3, sleep_time=0.05)
    start = time.monotonic()
    with pytest.raises(DeviceUnavailableError, match=r"after waiting 0\.3 s"):
        await mine(tmp_path).get_device(wait_config=wait)
    assert 0.3 <= time.monotonic() - start < 5


async def test_the_waiter_gets_the_device_of_a_holder_killed_with_sigkill(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    wait = DeviceWaitConfig(DeviceWaitStrategy.WAIT_FOREVER, sleep_time=0.02)
    async with anyio.create_task_group() as tg:
        got = []

        async def attach() -> None:
            got.append(await mine(tmp_path).get_device(wait_config=wait))

        tg.start_soon(attach)
        os.kill(holder.pid, signal.SIGKILL)  # no detach: the kernel drops the lock
    assert holder.wait() == -signal.SIGKILL
    assert got[0].is_attached
    got[0].detach()


@pytest.fixture
def prober(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that tries to attach the only device for each line it reads."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(tmp_path),
        cwd=ROOT,
    )
    yield proc
    proc.kill()
    proc.wait()


async def test_a_device_shared_here_is_exclusive_to_other_processes(
    tmp_path: Path, prober: subprocess.Popen[str]
) -> None:
    """Three attachments in this process (one lock, counted); another process cannot attach
    the device while any of them is attached, and can once the last one detaches."""
    proc = prober

    async def probe() -> str:
        say(proc)
        assert proc.stdout is not None
        with anyio.fail_after(30):
            return (await anyio.to_thread.run_sync(proc.stdout.readline)).strip()

    m = mine(tmp_path)
    devices = [await m.get_device(), await m.get_device(), await m.get_specific_device(0)]
    assert {d.id for d in devices} == {0} and m.attachments(0) == 3
    assert await probe() == "held"
    devices[0].detach()
    devices[0].detach()  # idempotent: still two attachments
    devices[1].detach()
    assert await probe() == "held"
    devices[2].detach()
    assert await probe() == "got"  # the last detach released the lock
    again = await m.get_device()  # and the other process let go of it again
    assert again.is_attached and m.attachments(0) == 1
    assert await probe() == "held"
    again.detach()
