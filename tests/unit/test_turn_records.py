"""The requests that succeed in one turn of the event loop are recorded once
(:class:`~model_runtime.server.inference.accounting.TurnRecords`): statistics and metrics read
as if each had been recorded by itself, they are recorded before anything the loop runs after
them, and the requests leave the in-flight count even when recording fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from model_runtime.server.inference.accounting import TurnRecords
from model_runtime.server.observability.metrics import DaemonMetrics
from model_runtime.server.repository.entries import ModelEntry

pytestmark = pytest.mark.timeout(10)

TOOK = [(0.0012, 1), (0.0307, 4), (0.25, 2), (1.5e-5, 1), (0.0013, 3), (0.0011, 1)]
# (seconds, samples) per request; the last two share a duration bucket with the first


def _exposition(metrics: DaemonMetrics) -> list[str]:
    """Every sample of model ``m`` but the times its series were made."""
    lines = metrics.render().decode().splitlines()
    return [line for line in lines if 'model="m"' in line and "_created{" not in line]


async def test_a_turn_reads_as_each_request_recorded_by_itself() -> None:
    one, each = ModelEntry("m", Path("m")), ModelEntry("m", Path("m"))
    turn_metrics, each_metrics = DaemonMetrics(cpu=False), DaemonMetrics(cpu=False)
    left: list[tuple[str, str]] = []
    turn = TurnRecords(turn_metrics, lambda m, v, n: left.extend([(m, v)] * n))
    for seconds, samples in TOOK:
        turn.add(one, seconds, samples)
        each.stats.record(True, int(seconds * 1e9), samples)
        each_metrics.observe("m", None, seconds, samples, "1")
    assert one.stats.success_count == 0 and not left  # not before the loop's next call
    await asyncio.sleep(0)
    for field in ("success_count", "success_ns", "inference_count", "fail_count"):
        assert getattr(one.stats, field) == getattr(each.stats, field), field
    assert len(_exposition(each_metrics)) > 10  # the Triton and our own series of it
    assert _exposition(turn_metrics) == _exposition(each_metrics)
    assert left == [("m", "1")] * len(TOOK)


async def test_a_turn_is_recorded_before_what_the_loop_runs_after_it() -> None:
    entry = ModelEntry("m", Path("m"))
    turn = TurnRecords(DaemonMetrics(cpu=False), lambda model, version, n: None)
    seen: list[int] = []
    turn.add(entry, 0.001, 1)
    asyncio.get_running_loop().call_soon(lambda: seen.append(entry.stats.success_count))
    turn.add(entry, 0.001, 1)  # the same turn: recorded by the same call
    await asyncio.sleep(0)
    assert seen == [2]


class _Broken(DaemonMetrics):
    def observe_ok(self, model: str, version: str, seconds: list[float], samples: int) -> None:
        raise RuntimeError("metrics broke")


def test_requests_leave_even_when_their_recording_fails() -> None:
    left: list[str] = []

    async def main() -> None:
        turn = TurnRecords(_Broken(cpu=False), lambda m, v, n: left.extend([m] * n))
        turn.add(ModelEntry("a", Path("a")), 0.001, 1)
        turn.add(ModelEntry("b", Path("b")), 0.001, 1)
        with pytest.raises(RuntimeError, match="metrics broke"):
            turn.record()

    asyncio.run(main())
    assert left == ["a", "b"]
