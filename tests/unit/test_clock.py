"""The injectable clock: ``move_on_after`` behaves the same on the fake clock as on the real
one (a deadline cancels the body; the body's own errors come out as they are)."""

from __future__ import annotations

import anyio
import pytest

from actors.clock import FakeClock, SystemClock, move_on_after

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("clock", [FakeClock(), SystemClock()], ids=["fake", "system"])
async def test_the_body_error_comes_out_unwrapped(clock: FakeClock | SystemClock) -> None:
    cause = ValueError("the cause")
    with pytest.raises(KeyError) as caught:
        async with move_on_after(clock, 5.0):
            raise KeyError("boom") from cause
    assert caught.value.__cause__ is cause


async def test_the_fake_deadline_cancels_only_when_time_passes_it() -> None:
    clock = FakeClock()
    done = anyio.Event()

    async def body() -> None:
        async with move_on_after(clock, 2.0) as scope:
            await anyio.sleep_forever()
        assert scope.cancelled_caught
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(body)
        await anyio.wait_all_tasks_blocked()
        clock.advance(1.9)
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set()
        clock.advance(0.2)
        await done.wait()
