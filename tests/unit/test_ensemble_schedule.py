"""Running an ensemble request's steps: each starts as soon as what it reads exists (so
independent steps run at once), arrays pass by reference, unneeded steps are pruned, a step
whose inputs were all left out is skipped, the first failure ends the request naming its step
and model (the other steps cancelled), and the deadline bounds every step."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import pytest

from model_runtime.errors import InputValidationError
from model_runtime.server.answers import HTTPError
from model_runtime.server.ensemble import needed_steps, run_steps
from model_runtime.server.ensemble.schedule import stream_steps
from model_runtime.server.triton.ensemble import EnsembleConfig, EnsembleStep

pytestmark = pytest.mark.timeout(10)


def step(i: int, model: str, ins: dict[str, str], outs: dict[str, str]) -> EnsembleStep:
    return EnsembleStep(i, model, -1, ins, outs)


#: IN -> a -> T1 -> c -> OUT1 ; IN -> b -> T2 -> d -> OUT2 (two independent branches)
FORK = EnsembleConfig(
    "e",
    (
        step(0, "a", {"x": "IN"}, {"y": "T1"}),
        step(1, "b", {"x": "IN"}, {"y": "T2"}),
        step(2, "c", {"x": "T1"}, {"y": "OUT1"}),
        step(3, "d", {"x": "T2"}, {"y": "OUT2"}),
    ),
    ("IN",),
    ("OUT1", "OUT2"),
)


class Calls:
    """Step calls that add their step's index + 1; ``gate[model]`` holds a step until set."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.seen: dict[str, Any] = {}
        self.cancelled: list[str] = []
        self.fail: dict[str, Exception] = {}
        self.timeouts: list[float | None] = []

    async def __call__(
        self, s: EnsembleStep, inputs: dict[str, Any], left: float | None
    ) -> Mapping[str, Any]:
        self.started.append(s.model)
        self.timeouts.append(left)
        self.seen[s.model] = inputs["x"]
        try:
            gate = self.gates.get(s.model)
            if gate is not None:
                await gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(s.model)
            raise
        if s.model in self.fail:
            raise self.fail[s.model]
        return {"y": inputs["x"] + (s.index + 1)}


async def test_independent_steps_run_at_once_and_each_starts_when_its_input_exists() -> None:
    calls = Calls()
    calls.gates["a"] = asyncio.Event()  # branch a is slow
    x = np.zeros(2, np.float32)
    task = asyncio.ensure_future(run_steps(FORK, {"IN": x}, ["OUT1", "OUT2"], calls))
    for _ in range(20):
        await asyncio.sleep(0)
    # b, then d ran while a still waits: d did not wait for the slow branch
    assert calls.started == ["a", "b", "d"]
    calls.gates["a"].set()
    out = await task
    assert calls.started == ["a", "b", "d", "c"]
    np.testing.assert_array_equal(out["OUT1"], x + 1 + 3)
    np.testing.assert_array_equal(out["OUT2"], x + 2 + 4)


async def test_tensors_pass_by_reference() -> None:
    calls = Calls()
    x = np.zeros(2, np.float32)
    out = await run_steps(FORK, {"IN": x}, ["OUT1"], calls)
    assert calls.seen["a"] is x  # the request's array itself, no copy
    assert calls.seen["c"] is not x and calls.seen["c"] is not None
    assert set(out) == {"OUT1"}


async def test_a_chain_of_steps_runs_in_the_requests_own_task() -> None:
    # each step of a chain (one step can run at a time) is awaited by the request itself:
    # no task per step; a failing one is still named
    tasks: list[asyncio.Task[Any] | None] = []
    calls = Calls()

    async def call(s: EnsembleStep, inputs: dict[str, Any], left: float | None) -> Any:
        tasks.append(asyncio.current_task())
        return await calls(s, inputs, left)

    out = await run_steps(FORK, {"IN": np.zeros(1)}, ["OUT2"], call)
    assert tasks == [asyncio.current_task()] * 2 and calls.started == ["b", "d"]
    np.testing.assert_array_equal(out["OUT2"], np.zeros(1) + 2 + 4)
    calls.fail["d"] = InputValidationError("input 'x' has the wrong shape")
    with pytest.raises(HTTPError) as info:
        await run_steps(FORK, {"IN": np.zeros(1)}, ["OUT2"], call)
    assert str(info.value) == "in ensemble 'e', step 3 (model 'd'): input 'x' has the wrong shape"
    # a chain over an input left out: what depends only on it is skipped, as in any graph
    chain = EnsembleConfig(
        "e",
        (step(1, "b", {"x": "T"}, {"y": "OUT"}), step(0, "a", {"x": "OPT"}, {"y": "T"})),
        ("OPT",),
        ("OUT",),
    )
    tasks.clear()
    assert await run_steps(chain, {}, ["OUT"], call) == {} and tasks == []
    out = await run_steps(chain, {"OPT": np.zeros(1)}, ["OUT"], call)
    np.testing.assert_array_equal(out["OUT"], np.zeros(1) + 1 + 2)  # a, then b


class Queued:
    """Step calls that queue their step as they are called: the future of each, which the
    test answers (its input + its index + 1); ``refuse[model]`` is raised as it is called."""

    def __init__(self) -> None:
        self.steps: list[tuple[EnsembleStep, dict[str, Any], float | None]] = []
        self.futures: list[asyncio.Future[dict[str, Any]]] = []
        self.refuse: dict[str, Exception] = {}

    def __call__(
        self, s: EnsembleStep, inputs: dict[str, Any], left: float | None
    ) -> asyncio.Future[dict[str, Any]]:
        if s.model in self.refuse:
            raise self.refuse[s.model]
        self.steps.append((s, inputs, left))
        self.futures.append(asyncio.get_running_loop().create_future())
        return self.futures[-1]

    def answer(self, i: int = -1) -> None:
        s, inputs, _ = self.steps[i]
        self.futures[i].set_result({"y": inputs["x"] + (s.index + 1)})

    @property
    def models(self) -> list[str]:
        return [s.model for s, _, _ in self.steps]


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_steps_queued_as_they_are_called_pass_their_outputs_by_reference() -> None:
    # a step call may queue its step at once and give the future of its outputs (the data
    # plane's, for a plain model): the request awaits that future itself
    queued = Queued()
    x = np.zeros(2, np.float32)
    request = asyncio.ensure_future(run_steps(FORK, {"IN": x}, ["OUT2"], queued, timeout=30.0))
    await turns()
    assert queued.models == ["b"] and queued.steps[0][1]["x"] is x
    queued.answer()
    await turns()
    assert queued.models == ["b", "d"] and not request.done()
    assert queued.steps[1][1]["x"] is queued.futures[0].result()["y"]  # by reference
    first, second = queued.steps[0][2], queued.steps[1][2]
    assert first is not None and second is not None and 0 < second <= first <= 30.0
    queued.answer()
    out = await request
    assert set(out) == {"OUT2"}
    np.testing.assert_array_equal(out["OUT2"], x + 2 + 4)
    # steps that run at once, each queued as it is called
    request = asyncio.ensure_future(run_steps(FORK, {"IN": x}, ["OUT1", "OUT2"], queued))
    await turns()
    assert queued.models[2:] == ["a", "b"]
    queued.answer(2)
    queued.answer(3)
    await turns()
    assert queued.models[4:] == ["c", "d"]
    queued.answer(4)
    queued.answer(5)
    assert set(await request) == {"OUT1", "OUT2"}


@pytest.mark.parametrize(
    ("wanted", "refused", "index"),
    [(["OUT1"], "a", 0), (["OUT1", "OUT2"], "b", 1)],
    ids=["chain", "fork"],
)
async def test_a_step_refused_as_it_is_queued_fails_the_request_naming_it(
    wanted: list[str], refused: str, index: int
) -> None:
    queued = Queued()
    queued.refuse[refused] = InputValidationError("the queue is full")
    with pytest.raises(HTTPError) as info:
        await run_steps(FORK, {"IN": np.zeros(1)}, wanted, queued)
    text = f"in ensemble 'e', step {index} (model '{refused}'): the queue is full"
    assert str(info.value) == text and info.value.status == 400
    assert queued.models == ["a"][:index]  # (fork: a was queued before b was refused)
    assert all(f.cancelled() for f in queued.futures)  # and does not run on


async def test_a_request_left_by_its_caller_cancels_the_queued_step_in_flight() -> None:
    queued = Queued()
    request = asyncio.ensure_future(run_steps(FORK, {"IN": np.zeros(1)}, ["OUT1"], queued))
    await turns()
    queued.answer()
    await turns()
    request.cancel()  # the client went away
    await turns()
    assert queued.models == ["a", "c"] and queued.futures[1].cancelled()


async def test_steps_nobody_needs_are_not_run() -> None:
    calls = Calls()
    await run_steps(FORK, {"IN": np.zeros(1)}, ["OUT2"], calls)
    assert calls.started == ["b", "d"]
    assert [s.model for s in needed_steps(FORK, ["OUT1"])] == ["a", "c"]


async def test_a_failing_step_fails_the_request_naming_step_and_model() -> None:
    calls = Calls()
    calls.gates["a"] = asyncio.Event()
    calls.fail["b"] = InputValidationError("input 'x' has the wrong shape")
    with pytest.raises(HTTPError) as info:
        await run_steps(FORK, {"IN": np.zeros(1)}, ["OUT1", "OUT2"], calls)
    assert str(info.value) == ("in ensemble 'e', step 1 (model 'b'): input 'x' has the wrong shape")
    assert info.value.status == 400  # the step's own failure's status
    assert calls.cancelled == ["a"]  # the other branch does not run on
    assert "c" not in calls.started and "d" not in calls.started


async def test_a_step_whose_inputs_were_all_left_out_is_skipped() -> None:
    config = EnsembleConfig(
        "e",
        (
            step(0, "a", {"x": "IN"}, {"y": "OUT1"}),
            step(1, "b", {"x": "OPT"}, {"y": "OUT2"}),
        ),
        ("IN", "OPT"),
        ("OUT1", "OUT2"),
    )
    calls = Calls()
    out = await run_steps(config, {"IN": np.zeros(1)}, ["OUT1", "OUT2"], calls)
    assert calls.started == ["a"]
    assert set(out) == {"OUT1"}


async def test_the_deadline_bounds_every_step() -> None:
    calls = Calls()
    await run_steps(FORK, {"IN": np.zeros(1)}, ["OUT1"], calls, timeout=30.0)
    first, second = calls.timeouts
    assert first is not None and second is not None
    assert 0 < second <= first <= 30.0
    calls = Calls()
    with pytest.raises(HTTPError) as info:
        await run_steps(FORK, {"IN": np.zeros(1)}, ["OUT1"], calls, timeout=0.0)
    assert info.value.status == 504 and calls.started == []
    assert "deadline" in str(info.value)


async def test_what_follows_a_decoupled_step_runs_once_per_response() -> None:
    config = EnsembleConfig(
        "e",
        (
            step(0, "split", {"x": "IN"}, {"y": "PART"}),
            step(1, "plus", {"x": "PART"}, {"y": "OUT"}),
        ),
        ("IN",),
        ("OUT",),
    )
    calls = Calls()

    async def stream(
        s: EnsembleStep, inputs: dict[str, Any], left: float | None
    ) -> AsyncIterator[Mapping[str, Any]]:
        for row in inputs["x"]:
            yield {"y": row}

    got = [
        out["OUT"].tolist()
        async for out in stream_steps(
            config, {"IN": np.array([[1], [2], [3]])}, ["OUT"], calls, stream, frozenset({0})
        )
    ]
    assert got == [[3], [4], [5]]  # each part + 2 (step 1's index + 1)
    assert calls.started == ["plus", "plus", "plus"]


#: IN -> split (decoupled: one response per row) -> PART -> plus -> OUT
SPLIT = EnsembleConfig(
    "e",
    (step(0, "split", {"x": "IN"}, {"y": "PART"}), step(1, "plus", {"x": "PART"}, {"y": "OUT"})),
    ("IN",),
    ("OUT",),
)


async def rows(s: EnsembleStep, inputs: dict[str, Any], left: float | None) -> AsyncIterator[Any]:
    for row in inputs["x"]:
        yield {"y": row}


async def collect(
    config: EnsembleConfig, calls: Any, stream: Any, decoupled: set[int]
) -> list[Any]:
    outs = stream_steps(
        config, {"IN": np.array([[1], [2]])}, ["OUT"], calls, stream, frozenset(decoupled)
    )
    return [out["OUT"].tolist() async for out in outs]


async def test_the_branches_of_a_decoupled_steps_responses_run_at_once() -> None:
    came: dict[int, asyncio.Event] = {1: asyncio.Event(), 2: asyncio.Event()}

    async def plus(s: EnsembleStep, inputs: dict[str, Any], left: float | None) -> Any:
        value = int(inputs["x"][0])
        came[value].set()
        if value == 1:  # the first response's branch goes on only once the second's came
            await came[2].wait()
        return {"y": inputs["x"] + 2}

    got = await asyncio.wait_for(collect(SPLIT, plus, rows, {0}), 5)
    assert got == [[4], [3]]  # each as its branch ends: the second's first


async def test_a_decoupled_step_after_a_decoupled_step_streams_for_each_response_at_once() -> None:
    """split -> again (decoupled too): again's streams for split's two responses run at once,
    and each of their responses flows out as it comes."""
    config = EnsembleConfig(
        "e",
        (
            step(0, "split", {"x": "IN"}, {"y": "PART"}),
            step(1, "again", {"x": "PART"}, {"y": "OUT"}),
        ),
        ("IN",),
        ("OUT",),
    )
    second = asyncio.Event()

    async def stream(s: EnsembleStep, inputs: dict[str, Any], left: float | None) -> Any:
        if s.model == "split":
            async for out in rows(s, inputs, left):
                yield out
            return
        value = int(inputs["x"][0])
        yield {"y": inputs["x"] * 10}
        if value == 1:  # its second response only once the stream for 2 has begun
            await second.wait()
        else:
            second.set()
        yield {"y": inputs["x"] * 100}

    got = await asyncio.wait_for(collect(config, Calls(), stream, {0, 1}), 5)
    assert got == [[10], [20], [200], [100]]


async def test_a_failing_branch_ends_the_stream_and_cancels_the_others() -> None:
    calls = Calls()
    calls.gates["plus"] = asyncio.Event()  # never set: only a cancellation ends the wait
    failing = InputValidationError("row 2 is bad")

    async def plus(s: EnsembleStep, inputs: dict[str, Any], left: float | None) -> Any:
        if int(inputs["x"][0]) == 2:
            raise failing
        return await calls(s, inputs, left)

    with pytest.raises(HTTPError) as info:
        await asyncio.wait_for(collect(SPLIT, plus, rows, {0}), 5)
    assert info.value.status == 400
    assert "step 1 (model 'plus'): row 2 is bad" in str(info.value)
    assert calls.started == ["plus"] and calls.cancelled == ["plus"]


async def test_a_stream_left_by_its_caller_cancels_the_branches_still_running() -> None:
    calls = Calls()
    calls.gates["plus"] = asyncio.Event()  # never set
    both_wait = asyncio.Event()

    async def stream(s: EnsembleStep, inputs: dict[str, Any], left: float | None) -> Any:
        yield {"y": np.array([0])}  # a response whose branch does not wait
        async for out in rows(s, inputs, left):
            yield out

    async def plus(s: EnsembleStep, inputs: dict[str, Any], left: float | None) -> Any:
        if int(inputs["x"][0]) == 0:
            return {"y": inputs["x"]}
        if len(calls.started) == 1:
            both_wait.set()
        return await calls(s, inputs, left)

    outs = stream_steps(SPLIT, {"IN": np.array([[1], [2]])}, ["OUT"], plus, stream, frozenset({0}))
    got = await asyncio.wait_for(anext(outs), 5)
    assert got["OUT"].tolist() == [0]
    await asyncio.wait_for(both_wait.wait(), 5)  # the two other branches wait in plus
    await outs.aclose()  # the caller leaves
    assert sorted(calls.cancelled) == ["plus", "plus"]
