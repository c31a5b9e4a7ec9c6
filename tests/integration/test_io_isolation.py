"""One caller's bad request never hurts the others sharing its batch.

Requests are packed together into device batches, so anything wrong with one of them that
got past ``execute()`` would fail (or corrupt) every request in the batch. Each test here sends
one bad request in the middle of good concurrent ones that together fill whole batches: the bad
caller gets a typed error naming what is wrong, the good callers get their own right rows, and
the bad request is never queued (the statistics count only the good ones).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from model_runtime.errors import InputValidationError
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.integration.runner_support import compile_to
from tests.models import OPSET

pytestmark = pytest.mark.timeout(60)

WIDTH = 4
BATCH = 4


def make_two_in_two_out() -> onnx.ModelProto:
    """``sum = a + b`` and ``prod = a * b``, all float32 [N, WIDTH]."""

    def vi(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", WIDTH])

    graph = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Mul", ["a", "b"], ["prod"]),
        ],
        "two_in_two_out",
        [vi("a"), vi("b")],
        [vi("sum"), vi("prod")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def two_in_two_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_to(make_two_in_two_out(), tmp_path_factory.mktemp("two"), batch_size=BATCH)


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, WIDTH)).astype(np.float32)


def pair(n: int, seed: int) -> dict[str, np.ndarray]:
    return {"a": rows(n, seed), "b": rows(n, seed + 1000)}


Call = tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]


async def serve_around(
    runner: ModelRunner, good: list[Call], bad: Call, bad_at: int
) -> tuple[dict[int, dict[str, np.ndarray]], dict[str, BaseException]]:
    """Run every call of ``good`` concurrently, with ``bad`` submitted after the first
    ``bad_at`` of them; return the good results by index, and what the bad caller got."""
    results: dict[int, dict[str, np.ndarray]] = {}
    bad_outcome: dict[str, BaseException] = {}

    async def good_caller(i: int) -> None:
        inputs, outputs = good[i]
        results[i] = await runner.execute(inputs, outputs)

    async def bad_caller() -> None:
        try:
            await runner.execute(*bad)
        except Exception as exc:
            bad_outcome["error"] = exc

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for i in range(len(good)):
                if i == bad_at:
                    tg.start_soon(bad_caller)
                tg.start_soon(good_caller, i)
    return results, bad_outcome


def assert_served(good: list[Call], results: Mapping[int, Mapping[str, np.ndarray]]) -> None:
    assert sorted(results) == list(range(len(good)))
    for i, (inputs, outputs) in enumerate(good):
        got = results[i]
        a, b = inputs["a"], inputs["b"]
        np.testing.assert_allclose(got["sum"], a + b, rtol=1e-6)
        np.testing.assert_allclose(got["prod"], a * b, rtol=1e-6)
        if outputs is not None:  # filled in place
            np.testing.assert_allclose(outputs["sum"], a + b, rtol=1e-6)


async def requests_recorded(runner: ModelRunner) -> float:
    counts = await runner.get_monitoring_statistics_total_count()
    return counts["request_monitoring_statistics_count"]


@pytest.mark.parametrize(("a_rows", "b_rows"), [(2, 1), (1, 3)], ids=["b-has-fewer", "b-has-more"])
async def test_inputs_that_disagree_on_samples_fail_only_their_caller(
    two_in_two_out: Path, a_rows: int, b_rows: int
) -> None:
    # Eight good one-row callers fill two whole batches: nothing waits for a timeout.
    good: list[Call] = [(pair(1, seed=i), None) for i in range(2 * BATCH)]
    bad: Call = ({"a": rows(a_rows, 90), "b": rows(b_rows, 91)}, None)
    async with ModelRunner(two_in_two_out, ModelRunnerConfig(batching_dim=0)) as runner:
        results, outcome = await serve_around(runner, good, bad, bad_at=2)
        recorded = await requests_recorded(runner)
    error = outcome.get("error")
    assert isinstance(error, InputValidationError), error
    assert f"input 'b' has {b_rows} samples but input 'a' has {a_rows}" in str(error)
    assert_served(good, results)
    assert recorded == len(good), "the bad request was never queued"


async def test_a_read_only_output_buffer_fails_only_its_caller(two_in_two_out: Path) -> None:
    # Good callers with and without their own buffers; together two whole batches.
    good: list[Call] = []
    for i in range(BATCH):
        inputs = pair(2, seed=10 * i)
        own = {n: np.zeros((2, WIDTH), np.float32) for n in ("sum", "prod")} if i % 2 else None
        good.append((inputs, own))
    frozen = np.zeros((2, WIDTH), np.float32)
    frozen.flags.writeable = False
    bad: Call = (pair(2, seed=99), {"sum": frozen, "prod": np.zeros((2, WIDTH), np.float32)})
    async with ModelRunner(two_in_two_out, ModelRunnerConfig(batching_dim=0)) as runner:
        results, outcome = await serve_around(runner, good, bad, bad_at=1)
        recorded = await requests_recorded(runner)
    error = outcome.get("error")
    assert isinstance(error, InputValidationError), error
    assert "output buffer 'sum' is read-only" in str(error)
    assert not frozen.any()
    assert_served(good, results)
    assert recorded == len(good), "the bad request was never queued"


async def test_output_buffers_of_the_wrong_shape_fail_only_their_caller(
    two_in_two_out: Path,
) -> None:
    good: list[Call] = [(pair(1, seed=i), None) for i in range(BATCH)]
    wrong: dict[str, Any] = {
        "sum": np.zeros((3, WIDTH), np.float32),  # three rows for a two-row request
        "prod": np.zeros((2, WIDTH), np.float32),
    }
    bad: Call = (pair(2, seed=7), wrong)
    async with ModelRunner(two_in_two_out, ModelRunnerConfig(batching_dim=0)) as runner:
        results, outcome = await serve_around(runner, good, bad, bad_at=1)
    error = outcome.get("error")
    assert isinstance(error, InputValidationError), error
    assert "output buffer 'sum' is float32[3, 4], expected float32[2, 4]" in str(error)
    assert_served(good, results)
