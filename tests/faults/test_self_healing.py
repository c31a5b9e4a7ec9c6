"""Self-healing with the default policy: poisoned requests are isolated, replicas that stop
making progress leave service and come back, crash storms and dying devices never spin the
supervisors, and a runner is started and closed from any task.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest

from actors.device.manager import DeviceManager
from actors.session.state import ReplicaStatus
from model_runtime.errors import (
    ExecutionTimeoutError,
    ModelUnavailableError,
    RecoverableRuntimeError,
    RuntimeFailure,
)
from model_runtime.runner import ModelRunner
from tests.faults.harness import WIDTH, drive
from tests.faults.scenarios import (
    TABLE_ROWS,
    default_config,
    poisoned_requests,
    serve_until,
    served_again,
)
from tests.integration.runner_support import Reference, compile_to
from tests.models import make_embedding, make_mlp

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Reference]:
    onnx_model = make_mlp(sizes=(WIDTH, 48, 10), seed=5)
    path = compile_to(onnx_model, tmp_path_factory.mktemp("heal"), batch_size=4)
    return path, Reference(onnx_model)


@pytest.fixture(scope="module")
def embedding(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Reference]:
    onnx_model = make_embedding(rows=TABLE_ROWS)
    path = compile_to(onnx_model, tmp_path_factory.mktemp("poison"), batch_size=8)
    return path, Reference(onnx_model)


async def test_3000_mixed_requests_under_recoverable_every_20_all_answered(
    mlp: tuple[Path, Reference],
) -> None:
    path, ref = mlp
    out = await drive(path, ref, default_config("recoverable:every=20"), callers=300, per_caller=10)
    assert out.sent == 3000
    assert out.ok == 3000, f"errors {dict(out.errors)}, wrong {out.wrong}, lost {out.lost}"
    assert out.resets > 10, "the plan fired and the replicas recovered each time"
    assert out.statuses == ["ready", "ready"]


async def test_poisoned_requests_get_typed_errors_and_nobody_else_notices(
    embedding: tuple[Path, Reference],
) -> None:
    path, ref = embedding
    out = await poisoned_requests(path, ref, good=1800, bad=60)
    assert out.lost == 0
    assert out.good_ok == 1800, f"good: errors {dict(out.good_errors)}, wrong {out.good_wrong}"
    assert out.bad_rejected == 60, f"poisoned answered otherwise: {dict(out.bad_other)}"
    assert "INVALID_ARGUMENT" in out.rejection and "1000" in out.rejection, out.rejection
    assert out.resets == 0, "data errors never reset a device"
    assert out.ready_after


async def test_a_burst_takes_a_replica_out_and_it_serves_again(
    mlp: tuple[Path, Reference],
) -> None:
    """A burst of faults on every run of replica 0 (in service on any host: replica 1 stands
    by on two cores): it leaves service after three failed recoveries, its work moves to
    replica 1, probes bring it back once the burst is over, and nobody gets an error."""
    plan = "recoverable:every=1:from=30:until=45:replica=0"
    path, ref = mlp
    out = await serve_until(path, ref, default_config(plan), done=served_again(0), watch=0)
    assert out.outages >= 1
    assert out.back_after is not None and out.back_after < 30, out.back_after
    assert out.failed == 0 and out.wrong == 0 and out.lost == 0, out
    assert out.statuses == ["ready", "ready"]


async def test_a_fatal_device_is_replaced_and_the_replica_returns(
    mlp: tuple[Path, Reference],
) -> None:
    path, ref = mlp
    out = await serve_until(
        path, ref, default_config("fatal:at=30:replica=0"), done=served_again(0), watch=0
    )
    assert out.outages == 1
    assert out.back_after is not None and out.back_after < 10, out.back_after
    assert out.failed == 0 and out.wrong == 0 and out.lost == 0, out


async def test_a_crash_storm_with_progress_keeps_both_replicas_serving(
    mlp: tuple[Path, Reference],
) -> None:
    path, ref = mlp
    out = await drive(path, ref, default_config("crash:every=3"), callers=100, per_caller=6)
    assert out.ok == out.sent, f"errors {dict(out.errors)}, wrong {out.wrong}, lost {out.lost}"
    assert out.statuses == ["ready", "ready"]


async def test_a_device_that_dies_after_every_restart_never_spins_the_supervisors(
    mlp: tuple[Path, Reference],
) -> None:
    """Replica 0's device crashes on every batch from its 20th on: restarted, it passes its
    warm-up and dies on the next batch. The replica leaves service, its work moves to replica
    1 (standing by on two cores), and restarts are paced by backoff (not ~20,000 a second)."""
    path, ref = mlp
    plan = "crash:every=1:from=20:replica=0"
    out = await serve_until(
        path, ref, default_config(plan), done=lambda r: False, bound=4.0, callers=32, watch=0
    )
    assert out.outages >= 1
    assert out.failed == 0 and out.wrong == 0, out
    assert out.restarts < 40, f"{out.restarts} restarts in 4 s: a tight loop"
    assert out.statuses[1] == "ready"


async def test_requests_move_to_the_other_replica_when_retries_run_out(
    mlp: tuple[Path, Reference],
) -> None:
    """With the default max_retries a batch that keeps failing on replica 0 is answered by
    replica 1; an error reaches a caller only when every replica in service failed it."""
    path, ref = mlp
    plan = "recoverable:every=1:from=10:until=12:replica=0"
    out = await drive(path, ref, default_config(plan), callers=100, per_caller=6)
    assert out.ok == out.sent, f"errors {dict(out.errors)}, wrong {out.wrong}, lost {out.lost}"
    one = await drive(
        path, ref, default_config("recoverable:every=1", replication_factor=1), callers=4
    )
    # Alone, the replica's callers get the fault, then (out of service) ModelUnavailableError.
    assert one.lost == 0 and one.ok == 0, one
    assert RecoverableRuntimeError.__name__ in one.errors, one.errors
    assert set(one.errors) <= {
        "RecoverableRuntimeError",
        "UnrecoverableRuntimeError",
        "ModelUnavailableError",
    }, one.errors


async def test_a_lone_replica_out_of_service_refuses_requests_as_unavailable(
    mlp: tuple[Path, Reference],
) -> None:
    """With one replica, execute() takes its queue only while it is READY: once the replica is
    out of service a request is refused with ModelUnavailableError (retry later; the cause is
    the last failure), not queued on the evacuated queue and refused as if the runner had
    stopped."""
    path, _ = mlp
    config = default_config("recoverable:every=1", replication_factor=1)
    x = {"x": np.ones((1, WIDTH), np.float32)}
    async with ModelRunner(path, config, device_manager=DeviceManager()) as runner:
        with anyio.fail_after(60):
            while runner.replica_status()[0] is not ReplicaStatus.FAILED:
                with pytest.raises(RuntimeFailure):
                    await runner.execute(x)  # every run fails; the replica leaves service
        with pytest.raises(ModelUnavailableError, match="no replica is in service"):
            await runner.execute(x)


async def test_start_and_close_in_different_tasks(mlp: tuple[Path, Reference]) -> None:
    path, _ = mlp
    manager = DeviceManager()
    runner = ModelRunner(path, default_config(), device_manager=manager)
    started = anyio.Event()

    async def starter() -> None:
        await runner.start()
        started.set()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(starter)
            await started.wait()
        assert runner.is_ready  # the starting task has ended; the runner still serves

        async def closer() -> None:
            await runner.execute({"x": np.ones((3, WIDTH), np.float32)})
            await runner.close()

        async with anyio.create_task_group() as tg:
            tg.start_soon(closer)
    assert not runner.is_ready
    assert all(info.holder is None for info in manager.list_devices()), "devices released"


async def test_a_hang_is_caught_near_the_deadline_floor_and_readiness_says_so(
    mlp: tuple[Path, Reference],
) -> None:
    """Default policy: the deadline comes from the warm-up and observed runs (floor 1 s), not
    10-60 s; a replica with a run past it is not ready until the reset is done."""
    path, ref = mlp
    x = np.ones((4, WIDTH), np.float32)
    async with ModelRunner(path, default_config("hang:at=3", replication_factor=1)) as runner:
        for _ in range(2):
            await runner.execute({"x": x})
        state = runner.replica_states()[0]
        readiness: list[bool] = []

        async def watch() -> None:
            while True:  # every status change, as it happens (no polling gaps)
                changed = state.changed
                await changed.wait()
                readiness.append(runner.is_ready)

        with anyio.fail_after(5):  # far below the old 10 s / 60 s deadlines
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                started = anyio.current_time()
                got = await runner.execute({"x": x})  # hangs, is reset, is retried
                took = anyio.current_time() - started
                tg.cancel_scope.cancel()
        np.testing.assert_allclose(got["logits"], ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)
        assert 0.9 < took < 3.0, f"the hang was caught after {took:.2f} s"
        assert state.resets == 1
        assert readiness[0] is False, "not ready from the moment the run passed its deadline"
        assert runner.is_ready


async def test_without_auto_reset_a_hang_is_raised_not_retried(
    mlp: tuple[Path, Reference],
) -> None:
    """The seed's auto_reset=False raises: the hung batch's caller gets ExecutionTimeoutError
    (the device is reset all the same, or it would serve nobody) and the next request is
    served."""
    path, _ = mlp
    x = np.ones((4, WIDTH), np.float32)
    config = default_config("hang:at=2", replication_factor=1, auto_reset=False)
    async with ModelRunner(path, config) as runner:
        await runner.execute({"x": x})
        with anyio.fail_after(5), pytest.raises(ExecutionTimeoutError, match="deadline"):
            await runner.execute({"x": x})
        await runner.execute({"x": x})
        state = runner.replica_states()[0]
        assert state.resets == 1 and state.retries == 0
