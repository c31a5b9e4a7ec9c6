"""The ragged batcher with a fake model runner: Triton's batch input kinds, batches formed up
to ``max_batch_size`` items and split back, requests whose other inputs differ in shape kept
apart, a failure answered to each request of its batch, a cancelled request dropped."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from model_runtime.errors import InputValidationError, ModelRuntimeError
from model_runtime.server.triton import model_config_pb2 as pb
from model_runtime.server.triton.ragged import BatchInput, RaggedRunner, RaggedSpec, batch_input

K = pb.BatchInput.Kind


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (K.BATCH_ELEMENT_COUNT, [3, 4, 2]),
        (K.BATCH_ACCUMULATED_ELEMENT_COUNT, [3, 7, 9]),
        (K.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, [0, 3, 7, 9]),
        (K.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, [0, 0, 0, 0]),
        (K.BATCH_ITEM_SHAPE, [[3], [4], [1], [1]]),
        (K.BATCH_ITEM_SHAPE_FLATTEN, [3, 4, 1, 1]),
    ],
)
def test_batch_input_kinds_are_tritons(kind: int, expected: list[Any]) -> None:
    sources = [np.zeros((1, 3)), np.zeros((1, 4)), np.zeros((2, 1))]  # the last: 2 items
    out = batch_input(BatchInput(kind, "INDEX", np.float32, "x"), sources)
    assert out.dtype == np.float32 and out.tolist() == expected


class FakeRunner:
    """Sums each request's ragged elements (INDEX: where each ends), one row per request."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[dict[str, np.ndarray]] = []
        self.fail = fail

    async def execute(
        self, inputs: Mapping[str, np.ndarray], *args: Any, **kwargs: Any
    ) -> dict[str, np.ndarray]:
        self.calls.append(dict(inputs))
        await asyncio.sleep(0)
        if self.fail:
            raise ModelRuntimeError("the model failed")
        ends = inputs["INDEX"].astype(np.int64)
        sums = np.add.reduceat(inputs["x"], np.concatenate([[0], ends[:-1]]))
        return {"y": sums.reshape(-1, 1), "w": inputs["w"] * 2}


def _runner(fake: FakeRunner, max_batch_size: int = 4) -> RaggedRunner:
    spec = RaggedSpec(
        frozenset({"x"}),
        (BatchInput(K.BATCH_ACCUMULATED_ELEMENT_COUNT, "INDEX", np.int32, "x"),),
        max_batch_size,
        delay=0.0,
    )
    return spec.wrap(fake)  # type: ignore[arg-type]


def _req(values: list[float], w: float = 1.0, width: int = 1) -> dict[str, np.ndarray]:
    return {
        "x": np.array([values], np.float32),
        "w": np.full((1, width), w, np.float32),
    }


async def test_concurrent_requests_form_one_batch_and_get_their_own_rows() -> None:
    fake = FakeRunner()
    runner = _runner(fake)
    answers = await asyncio.gather(
        runner.execute(_req([1, 2])), runner.execute(_req([3, 4, 5], 2)), runner.execute(_req([6]))
    )
    assert [a["y"].tolist() for a in answers] == [[[3.0]], [[12.0]], [[6.0]]]
    assert [a["w"].tolist() for a in answers] == [[[2.0]], [[4.0]], [[2.0]]]
    (call,) = fake.calls
    assert call["x"].tolist() == [1, 2, 3, 4, 5, 6] and call["INDEX"].tolist() == [2, 5, 6]


async def test_a_batch_holds_at_most_max_batch_size_items_and_like_shapes() -> None:
    fake = FakeRunner()
    runner = _runner(fake, max_batch_size=2)
    answers = await asyncio.gather(
        runner.execute(_req([1])),
        runner.execute(_req([2], width=3)),  # another shape of w: another batch
        runner.execute(_req([3])),
        runner.execute(_req([4])),
    )
    assert [a["y"].tolist() for a in answers] == [[[1.0]], [[2.0]], [[3.0]], [[4.0]]]
    assert sorted(len(c["INDEX"]) for c in fake.calls) == [1, 1, 2]
    with pytest.raises(InputValidationError, match="max_batch_size"):
        await runner.execute({"x": np.zeros((3, 1), np.float32), "w": np.zeros((3, 1))})


async def test_a_failed_batch_fails_each_of_its_requests_and_a_cancelled_one_is_dropped() -> None:
    runner = _runner(FakeRunner(fail=True))
    results = await asyncio.gather(
        runner.execute(_req([1])), runner.execute(_req([2])), return_exceptions=True
    )
    assert all(isinstance(r, ModelRuntimeError) for r in results)
    fake = FakeRunner()
    runner = _runner(fake)
    gone = asyncio.ensure_future(runner.execute(_req([1])))
    await asyncio.sleep(0)  # queued, its batch not run yet
    gone.cancel()
    kept = await runner.execute(_req([7]))
    assert kept["y"].tolist() == [[7.0]]
    assert [c["x"].tolist() for c in fake.calls] == [[7.0]]
