"""The low-level Session on real cpu devices with the tiny stateful executable
(``y = x @ W + b``; variable ``counter`` incremented by every iteration, output as
``counter_out``): lifecycle, callbacks and predicates, queues, shared devices, errors."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import numpy as np
import pytest

from actors.device import DeviceManager
from model_runtime.errors import DeviceStateError, InputValidationError
from model_runtime.executable import Executable
from model_runtime.executable.testing import tiny_executable
from model_runtime.lowlevel import (
    AnchorCallbackPolicy,
    AnchorsNotConnectedError,
    AnchorWithPolicy,
    CallbackInfo,
    LaunchPolicy,
    PopefDataUsagePolicy,
    QueueTimeoutError,
    Session,
    SessionConfig,
)
from model_runtime.lowlevel.predicate_factory import anchor_callbacks as ac, popef_data_usage as pd

pytestmark = pytest.mark.timeout(20)
SKIP = AnchorCallbackPolicy.SKIP_CB


def reference(exe: Executable, x: np.ndarray) -> np.ndarray:
    out: np.ndarray = x @ exe.tensor("W") + exe.tensor("b")
    return out


def note(events: list[str], *names: str) -> list[Callable[[], None]]:
    return [lambda n=n: events.append(n) for n in names]  # type: ignore[misc]


def saver(store: list[float]) -> Callable[[CallbackInfo], Callable[[np.ndarray], None]]:
    return lambda info: lambda v: store.append(float(v[0]))


def sink(store: list[np.ndarray]) -> Callable[[np.ndarray], None]:
    return lambda a: store.append(a.copy())


async def test_lifecycle_with_state_callbacks_and_immediate_policy(tmp_path: object) -> None:
    exe = tiny_executable(batch_size=2)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    ys: list[np.ndarray] = []
    counters: list[np.ndarray] = []
    saved: list[np.ndarray] = []
    async with Session(exe, SessionConfig(policy=LaunchPolicy.IMMEDIATE)) as s:
        assert s.device is not None and s.device.is_attached
        s.set_callback_for_anchor("x", lambda buf: np.copyto(buf, x))
        s.set_callback_for_anchor("y", sink(ys))
        s.set_callback_for_anchor("counter_out", sink(counters))
        s.set_user_output_handler(
            lambda info: sink(saved),
            ac.pred_program_flow_save(exe.metadata.program_flow, reject_policy=SKIP),
        )
        for _ in range(3):
            await s.run_main_programs()
        assert [float(c[0]) for c in counters] == [1.0, 2.0, 3.0]
        np.testing.assert_allclose(ys[-1], reference(exe, x), rtol=1e-6)
        values = await s.run_save_programs()
        assert float(values["counter"][0]) == 3.0 and float(saved[-1][0]) == 3.0
        await s.run_load_programs()  # variables back to their stored values
        await s.run_main_programs()
        assert float(counters[-1][0]) == 1.0
        results = await s.run_programs([1, 2])
        assert float(results[0][0]["counter_out"][0]) == 2.0
        assert float(results[1]["counter"][0]) == 2.0
        device = s.device
    assert float(saved[-1][0]) == 2.0  # closing unbinds: the save programs ran
    assert not device.is_attached  # IMMEDIATE: the session attached it, and released it


async def test_handlers_predicates_and_not_connected_errors() -> None:
    exe = tiny_executable(batch_size=2)
    flow = exe.metadata.program_flow
    async with Session(exe) as s:
        assert {a.name for a in s.get_input_anchors()} == {"x", "W", "b", "counter"}
        assert [a.name for a in s.get_user_input_anchors()] == ["x"]
        assert {a.name for a in s.get_user_output_anchors()} == {"y", "counter_out", "counter"}
        missing = s.anchors_not_connected_to_callbacks()
        assert {p: {a.name for a in v} for p, v in missing.items()} == {
            1: {"x", "y", "counter_out"},
            2: {"counter"},
        }
        with pytest.raises(AnchorsNotConnectedError) as err:
            s.error_if_anchors_are_not_connected_to_callbacks([1])
        assert set(err.value.anchors[1]) == {"x", "y", "counter_out"}
        with pytest.raises(DeviceStateError, match="not bound"):
            await s.run_main_programs()
        seen: list[str] = []

        def factory(info: CallbackInfo) -> Callable[[np.ndarray], None]:
            seen.append(info.anchor.name)
            return lambda a: None

        # main outputs that are not scalars get the user callback, the rest an empty one
        s.set_user_output_handler(
            factory,
            ac.and_bind(
                AnchorCallbackPolicy.BIND_USER_CB,
                AnchorCallbackPolicy.BIND_EMPTY_CB,
                ac.pred_program_flow_main(flow),
                ac.pred_non_scalar_type(),
            ),
        )
        assert seen == ["y"]
        assert set(s.anchors_not_connected_to_callbacks()) == {1}  # only x is left
        s.set_user_input_handler(factory)  # default: the user input anchors
        assert seen == ["y", "x"]
        s.set_user_input_handler(factory, skip_connected=True)
        assert seen == ["y", "x"]  # x is connected now
        assert s.anchors_not_connected_to_callbacks() == {}
        with pytest.raises(InputValidationError, match="no anchor 'nope'"):
            s.set_callback_for_anchor("nope", lambda a: None)
        with pytest.raises(InputValidationError, match="no program"):
            await s.run_programs([7])


async def test_user_data_policy_for_weights_and_bad_callback_data() -> None:
    exe = tiny_executable(batch_size=2)
    cfg = SessionConfig(
        pred_tensor_data=pd.pred_anchors_policies(
            [AnchorWithPolicy("b", PopefDataUsagePolicy.USE_USER_DATA)]
        )
    )
    manager = DeviceManager()
    async with Session(exe, cfg) as s:
        assert {a.name for a in s.get_user_input_anchors()} == {"x", "b"}
        await s.bind_to_device(await manager.get_device())
        s.set_callback_for_anchor("x", lambda buf: buf.fill(0))
        out: list[np.ndarray] = []
        s.set_callback_for_anchor("y", sink(out))
        # every other main output gets an empty callback (counter_out: dropped)
        empty_main = ac.pred_program_flow_main(
            exe.metadata.program_flow, AnchorCallbackPolicy.BIND_EMPTY_CB, SKIP
        )
        s.set_user_output_handler(lambda i: None, empty_main, skip_connected=True)
        with pytest.raises(AnchorsNotConnectedError, match="program 0: b"):
            await s.run_main_programs()  # the implicit load needs b from the user
        s.set_callback_for_anchor("b", lambda buf: np.full(3, 5, np.float32))
        await s.run_main_programs()
        np.testing.assert_array_equal(out[-1], np.full((2, 3), 5, np.float32))
        s.set_callback_for_anchor("x", lambda buf: np.zeros((3, 4), np.float32))
        with pytest.raises(InputValidationError, match="expected float32\\[2, 4\\]"):
            await s.run_main_programs()


async def test_queues_with_device_iterations_consume_i_elements_per_run() -> None:
    exe = tiny_executable(batch_size=2, device_iterations=3)
    manager = DeviceManager()
    async with Session(exe) as s:
        await s.bind_to_device(await manager.get_device())
        qm = s.create_queue_manager(2, timeout=0.05)
        s.set_callback_for_anchor("counter", lambda a: None)
        events: list[str] = []
        data = np.arange(4 * 7, dtype=np.float32).reshape(7, 4)
        x, y = qm.input_queue("x"), qm.output_queue("y")
        counter_out = qm.output_queue("counter_out")
        out = np.zeros((7, 3), np.float32)
        counters = np.zeros((3, 1), np.float32)
        for i, chunk in enumerate((data[:3], data[3:7])):  # 3 + 4 rows: packed into pairs
            await x.enqueue(chunk, *note(events, f"rs{i}", f"rc{i}"))
        await y.enqueue(out[:5], lambda: events.append("w0"))
        await y.enqueue(out[5:], lambda: events.append("w1"))
        for k in range(3):
            await counter_out.enqueue(counters[k], lambda: None)
        await s.run_main_programs()  # 3 iterations = 6 rows; row 7 waits for more
        assert events == ["rs0", "rs1", "rc0", "w0"]
        assert x.queued_elements == 0
        np.testing.assert_array_equal(counters[:, 0], [1.0, 2.0, 3.0])
        with pytest.raises(QueueTimeoutError, match="1 of 2 rows"):
            await s.run_main_programs()  # one row left: nothing runs, nothing lost
        qm.flush_all()  # pad the 7th row; then two dummy elements for the third run
        x.flush()
        x.flush()
        qm.output_queue("y").flush()
        qm.output_queue("y").flush()
        await s.run_main_programs()
        assert events[-2:] == ["rc1", "w1"]
        np.testing.assert_allclose(out, reference(exe, data), rtol=1e-5)
        # 3 outputs of the last run, one of them discarded by flush_all: 2 wait for buffers
        assert counter_out.waiting_elements == 2
        s.stop()
        assert s.is_stopped
        with pytest.raises(DeviceStateError, match="stopped"):
            await s.run_main_programs()
        await s.reload()
        qm.reset_all()
        assert not s.is_stopped and counter_out.waiting_elements == 0


async def test_two_sessions_share_one_device_with_implicit_save_and_load() -> None:
    a_exe, b_exe = tiny_executable(batch_size=2, seed=1), tiny_executable(batch_size=2, seed=2)
    device = await DeviceManager().get_device()
    saved: dict[str, list[float]] = {"a": [], "b": []}
    outs: dict[str, list[np.ndarray]] = {"a": [], "b": []}
    x = np.ones((2, 4), np.float32)
    async with Session(a_exe) as a, Session(b_exe) as b:
        for name, s in (("a", a), ("b", b)):
            s.set_callback_for_anchor("x", lambda buf: np.copyto(buf, x))
            s.set_callback_for_anchor("y", sink(outs[name]))
            s.set_callback_for_anchor("counter_out", lambda v: None)
            s.set_user_output_handler(
                saver(saved[name]),
                ac.pred_program_flow_save(s.model.metadata.program_flow, reject_policy=SKIP),
            )
        await a.bind_to_device(device)
        await a.run_main_programs()
        await a.run_main_programs()
        await b.bind_to_device(device)  # a's save programs run: its counter was 2
        assert saved == {"a": [2.0], "b": []}
        # One Device actor per device, the root's DeviceManager's, shared by both sessions.
        assert a._ref is b._ref and a._ref is not None and a._ref.is_alive
        await b.run_main_programs()
        await a.run_main_programs()  # switch back: b saved (1), a reloaded (counter from 0)
        assert saved == {"a": [2.0], "b": [1.0]}
        assert float((await a.run_save_programs())["counter"][0]) == 1.0
        np.testing.assert_allclose(outs["a"][-1], reference(a_exe, x), rtol=1e-6)
        np.testing.assert_allclose(outs["b"][-1], reference(b_exe, x), rtol=1e-6)
        await a.unload_from_device()
        with pytest.raises(DeviceStateError, match="not bound"):
            await a.run_main_programs()
    assert device.is_attached  # the caller attached it; the sessions never release it
    device.detach()


async def test_calls_outside_the_session_lifetime_are_typed_errors() -> None:
    s = Session(tiny_executable())
    with pytest.raises(DeviceStateError, match="not started"):
        await s.bind_to_device(await DeviceManager().get_device())
    async with s:
        with pytest.raises(InputValidationError):
            await s.bind_to_device("cpu:0")  # type: ignore[arg-type]
    with pytest.raises(DeviceStateError):
        await s.run_save_programs()


async def test_a_session_started_in_one_task_is_closed_in_another() -> None:
    """Sessions are clients of the runtime's tree: no task group is held across calls."""
    s = Session(tiny_executable(), SessionConfig(policy=LaunchPolicy.IMMEDIATE))
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.start)
    assert s.device is not None and s.device.is_attached
    device = s.device

    async def close() -> None:
        await s.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(close)
    assert not device.is_attached, "the session attached it (IMMEDIATE), the session released it"


async def test_stop_lets_a_run_waiting_for_data_finish_with_dummy_data() -> None:
    """Seed: stop() disconnects the queues, which then feed dummy data to the executable until
    its run returns; the run in progress finishes, only later runs are refused."""
    exe = tiny_executable(batch_size=2)
    async with Session(exe) as s:
        await s.bind_to_device(await DeviceManager().get_device())
        qm = s.create_queue_manager(2, timeout=30.0)
        s.set_callback_for_anchor("counter", lambda a: None)
        s.set_callback_for_anchor("counter_out", lambda v: None)
        s.set_callback_for_anchor("y", lambda v: None)
        assert qm.input_queue("x").queued_elements == 0
        results: list[object] = []

        async def run() -> None:
            results.append(await s.run_main_programs())

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await anyio.wait_all_tasks_blocked()
                assert results == []  # waiting for x
                s.stop()
        assert len(results) == 1 and isinstance(results[0], list)
        with pytest.raises(DeviceStateError, match="stopped"):
            await s.run_main_programs()
