"""An ensemble request whose steps form a chain, run by callbacks (``start_chain``): each step
queued as the one before it ends (in that very call, not a turn of the event loop later), the
request's answer handed on as its last step ends, the same outputs and errors as
``run_steps``, a step refused as it is queued or a passed deadline answered a turn later, and a
request that is cancelled drops the step it waits on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from model_runtime.errors import InputValidationError
from model_runtime.server.answers import HTTPError
from model_runtime.server.ensemble import run_steps
from model_runtime.server.ensemble.chain import start_chain
from model_runtime.server.triton.ensemble import EnsembleConfig, EnsembleStep

pytestmark = pytest.mark.timeout(10)

#: IN -> a -> T1 -> b -> T2 -> c -> OUT
CHAIN = EnsembleConfig(
    "e",
    (
        EnsembleStep(0, "a", -1, {"x": "IN"}, {"y": "T1"}),
        EnsembleStep(1, "b", -1, {"x": "T1"}, {"y": "T2"}),
        EnsembleStep(2, "c", -1, {"x": "T2"}, {"y": "OUT"}),
    ),
    ("IN",),
    ("OUT",),
)

Then = Callable[[asyncio.Future[Any]], None]


class Queued:
    """Step calls that queue each step (a future the test ends, as a python model's runner
    would: the future settled, then ``then`` called with it)."""

    def __init__(self) -> None:
        self.steps: list[tuple[EnsembleStep, dict[str, Any], asyncio.Future[Any], Then]] = []
        self.refuse: dict[str, Exception] = {}

    def __call__(
        self, s: EnsembleStep, inputs: dict[str, Any], left: float | None, then: Then
    ) -> asyncio.Future[Mapping[str, Any]]:
        if s.model in self.refuse:
            raise self.refuse[s.model]
        future: asyncio.Future[Mapping[str, Any]] = asyncio.get_running_loop().create_future()
        self.steps.append((s, inputs, future, then))
        return future

    def end(self, outcome: Mapping[str, Any] | Exception) -> None:
        """End the last step queued, as its runner does."""
        _, _, future, then = self.steps[-1]
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        then(future)


async def test_each_step_is_queued_as_the_one_before_ends_and_the_answer_follows_at_once() -> None:
    calls = Queued()
    answers: list[Any] = []
    x = np.arange(3, dtype=np.float32)
    future = start_chain(CHAIN, {"IN": x}, ["OUT"], calls, None, then=answers.append)
    assert future is not None
    assert [s.model for s, *_ in calls.steps] == ["a"]
    assert calls.steps[0][1]["x"] is x  # by reference
    t1 = x + 1
    calls.end({"y": t1})
    assert [s.model for s, *_ in calls.steps] == ["a", "b"]  # queued in that call
    assert calls.steps[1][1]["x"] is t1
    calls.end({"y": t1 + 1})
    calls.end({"y": t1 + 2})
    assert answers == [future]  # as the last step ended: no turn of the event loop between
    np.testing.assert_array_equal(future.result()["OUT"], x + 3)


async def test_a_failing_step_answers_as_run_steps_does() -> None:
    calls = Queued()
    answers: list[Any] = []
    future = start_chain(CHAIN, {"IN": np.zeros(1)}, ["OUT"], calls, None, then=answers.append)
    assert future is not None
    calls.end({"y": np.zeros(1)})
    calls.end(InputValidationError("bad shape"))
    assert answers == [future]
    with pytest.raises(HTTPError) as chained:
        future.result()

    async def failing(s: EnsembleStep, inputs: dict[str, Any], left: float | None) -> Any:
        if s.model == "b":
            raise InputValidationError("bad shape")
        return {"y": inputs["x"]}

    with pytest.raises(HTTPError) as awaited:
        await run_steps(CHAIN, {"IN": np.zeros(1)}, ["OUT"], failing)
    assert str(chained.value) == str(awaited.value)
    assert "step 1 (model 'b'): bad shape" in str(chained.value)
    assert chained.value.status == awaited.value.status


async def test_a_step_refused_as_it_is_queued_is_answered_a_turn_later() -> None:
    calls = Queued()
    calls.refuse["a"] = InputValidationError("no such input")
    answers: list[Any] = []
    future = start_chain(CHAIN, {"IN": np.zeros(1)}, ["OUT"], calls, None, then=answers.append)
    assert future is not None and future.done()
    assert answers == []  # not in the call that took the request
    await asyncio.sleep(0)
    assert answers == [future]
    with pytest.raises(HTTPError, match=r"step 0 \(model 'a'\): no such input"):
        future.result()


async def test_a_passed_deadline_fails_the_step_that_would_start() -> None:
    calls = Queued()
    future = start_chain(CHAIN, {"IN": np.zeros(1)}, ["OUT"], calls, 0.0)
    assert future is not None
    with pytest.raises(HTTPError, match=r"step 0 \(model 'a'\).*deadline"):
        await future
    assert calls.steps == []


async def test_a_cancelled_request_drops_the_step_it_waits_on() -> None:
    calls = Queued()
    answers: list[Any] = []
    future = start_chain(CHAIN, {"IN": np.zeros(1)}, ["OUT"], calls, None, then=answers.append)
    assert future is not None
    calls.end({"y": np.zeros(1)})
    waited = calls.steps[-1][2]
    future.cancel()
    await asyncio.sleep(0)
    assert waited.cancelled()
    assert answers == [future]  # told once, cancelled
    assert [s.model for s, *_ in calls.steps] == ["a", "b"]


async def test_a_step_run_as_a_coroutine_and_one_whose_inputs_were_left_out() -> None:
    # OPT alone feeds step "a": left out, "a" is skipped, and "b" runs on what is there.
    config = EnsembleConfig(
        "e",
        (
            EnsembleStep(0, "a", -1, {"x": "OPT"}, {"y": "T1"}),
            EnsembleStep(1, "b", -1, {"x": "T1", "z": "IN"}, {"y": "OUT"}),
        ),
        ("IN", "OPT"),
        ("OUT",),
    )
    ran: list[tuple[str, list[str]]] = []

    async def call(s: EnsembleStep, inputs: dict[str, Any], left: float | None, then: Then) -> Any:
        ran.append((s.model, sorted(inputs)))
        return {"y": (inputs["x"] if "x" in inputs else inputs["z"]) + 1}

    future = start_chain(config, {"IN": np.zeros(1)}, ["OUT"], call, None)
    assert future is not None
    np.testing.assert_array_equal((await future)["OUT"], [1.0])
    assert ran == [("b", ["z"])]


async def test_steps_that_could_run_at_once_are_not_a_chain() -> None:
    fork = EnsembleConfig(
        "e",
        (
            EnsembleStep(0, "a", -1, {"x": "IN"}, {"y": "T1"}),
            EnsembleStep(1, "b", -1, {"x": "IN"}, {"y": "T2"}),
        ),
        ("IN",),
        ("T1", "T2"),
    )
    calls = Queued()
    assert start_chain(fork, {"IN": np.zeros(1)}, ["T1", "T2"], calls, None) is None
    assert calls.steps == []
