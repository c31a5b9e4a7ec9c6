"""The fault-injection suite: device faults under sustained concurrent load, nothing lost.

Every scenario drives 2 replicas with hundreds of concurrent callers of mixed request sizes
while the fault plan makes the devices fail, and checks what a user would notice: every request
answered exactly once, every successful answer equal to the reference, no failures where
recovery is promised, no hang, and threads back to baseline afterwards.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest

from model_runtime.errors import ModelRuntimeError
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.faults.harness import WIDTH, Outcome, drive
from tests.integration.runner_support import Reference, compile_to
from tests.models import make_mlp

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Reference]:
    onnx_model = make_mlp(sizes=(WIDTH, 48, 10), seed=5)
    path = compile_to(onnx_model, tmp_path_factory.mktemp("faults"), batch_size=4)
    return path, Reference(onnx_model)


def config(plan: str, **overrides: object) -> ModelRunnerConfig:
    """Two replicas, dynamic batching, auto_reset on, the fault plan; every recovery limit
    (retries, failed recoveries, deadlines, backoff) at its default."""
    base: dict[str, object] = {
        "replication_factor": 2,
        "batching_dim": 0,
        "timeout": 0.0005,
        "auto_reset": True,
        "fault_plan": plan or None,
    }
    base.update(overrides)
    return ModelRunnerConfig(**base)  # type: ignore[arg-type]


def assert_nothing_lost(out: Outcome) -> None:
    assert out.lost == 0, f"{out.lost} of {out.sent} requests never answered"
    assert out.wrong == 0, f"{out.wrong} answers differ from the reference"
    assert out.answered + out.cancelled == out.sent
    assert out.threads_after <= out.threads_before, "worker threads leaked"
    assert out.rss_after - out.rss_before < 64 << 20, "memory grew by more than 64 MiB"


RECOVERED = [
    "recoverable:every=10",
    "recoverable:every=50",
    "app_error:every=10",
    "app_error:every=50",
    "app_error:p=0.05",
    "slow:every=10:seconds=0.01",
    "crash:every=25",
    "crash:every=60",
]


@pytest.mark.parametrize("plan", RECOVERED)
async def test_recoverable_faults_with_auto_reset_fail_nobody(
    model: tuple[Path, Reference], plan: str
) -> None:
    path, ref = model
    out = await drive(path, ref, config(plan))
    assert_nothing_lost(out)
    assert out.failed == 0, f"failed requests: {dict(out.errors)}"
    assert out.ok == out.sent
    assert out.faults > 0 or plan.startswith("slow"), "the plan never fired"


@pytest.mark.parametrize("plan", ["hang:every=40", "hang:at=5;hang:at=30"])
async def test_hangs_are_detected_reset_and_retried(
    model: tuple[Path, Reference], plan: str
) -> None:
    path, ref = model
    out = await drive(path, ref, config(plan), callers=100)
    assert_nothing_lost(out)
    assert out.failed == 0, f"failed requests: {dict(out.errors)}"
    assert out.resets > 0


async def test_without_auto_reset_errors_reach_their_callers_only(
    model: tuple[Path, Reference],
) -> None:
    path, ref = model
    out = await drive(path, ref, config("app_error:every=10", auto_reset=False))
    assert_nothing_lost(out)
    assert set(out.errors) == {"ApplicationRuntimeError"}
    assert 0 < out.failed < out.sent // 4
    assert out.resets == 0


async def test_recovery_actions_other_than_ipu_reset_are_raised_not_reset(
    model: tuple[Path, Reference],
) -> None:
    path, ref = model
    out = await drive(path, ref, config("recoverable:every=10:action=LINK_RESET"))
    assert_nothing_lost(out)
    assert set(out.errors) == {"RecoverableRuntimeError"}
    assert out.resets == 0


async def test_a_fatal_fault_on_one_replica_moves_its_work_to_the_other(
    model: tuple[Path, Reference],
) -> None:
    path, ref = model
    out = await drive(path, ref, config("fatal:at=30:replica=0"))
    assert_nothing_lost(out)
    assert out.failed == 0, f"failed requests: {dict(out.errors)}"
    assert out.statuses == ["failed", "ready"], "replica 0 out of service, replica 1 serving"
    # The batch that met the fault, and at most one more already in the device's queue
    # (pipeline depth 2); nothing is sent to a replica once it is out of service.
    assert 1 <= out.faults <= 2, "a replica out of service is never used again"


async def test_cancellations_and_deadlines_never_stall_the_batcher(
    model: tuple[Path, Reference],
) -> None:
    path, ref = model
    out = await drive(path, ref, config("app_error:every=15"), cancel_rate=0.2, deadline_rate=0.1)
    assert_nothing_lost(out)
    assert out.cancelled > 0
    # RequestTimeoutError: a deadline passed (Triton's 503, an ExecutionTimeoutError).
    assert set(out.errors) <= {"ExecutionTimeoutError", "RequestTimeoutError"}


@pytest.mark.long
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    "plan",
    ["recoverable:every=7;app_error:p=0.01;crash:every=97;slow:every=13:seconds=0.005"],
)
async def test_soak(model: tuple[Path, Reference], plan: str) -> None:
    path, ref = model
    out = await drive(path, ref, config(plan), callers=400, per_caller=50)
    assert_nothing_lost(out)
    assert out.failed == 0, f"failed requests: {dict(out.errors)}"


async def test_shutdown_while_a_device_hangs_answers_everyone(
    model: tuple[Path, Reference],
) -> None:
    """stop(grace) during a stuck run: every caller gets its result or RunnerStoppedError."""
    path, _ = model
    cfg = config("hang:at=3", execution_timeout=60.0, replication_factor=1)
    answers: list[str] = []
    runner = ModelRunner(path, cfg)
    started, stop_now = anyio.Event(), anyio.Event()

    async def host() -> None:  # the runner's life, start to stop, in one task
        await runner.start()
        started.set()
        await stop_now.wait()
        await runner.stop(grace=0.2)

    async def caller(i: int) -> None:
        try:
            await runner.execute({"x": np.ones((1 + i % 5, WIDTH), np.float32)})
            answers.append("ok")
        except ModelRuntimeError as exc:
            answers.append(type(exc).__name__)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(host)
            await started.wait()
            for i in range(60):
                tg.start_soon(caller, i)
            while runner.replica_states()[0].runs < 2:  # noqa: ASYNC110 - device progress
                await anyio.sleep(0.01)
            await anyio.wait_all_tasks_blocked()
            stop_now.set()
    assert len(answers) == 60, "every caller answered"
    assert set(answers) <= {"ok", "RunnerStoppedError"}
    assert "RunnerStoppedError" in answers, "the hung batch's callers were answered at stop"


async def test_a_session_actor_killed_mid_load_loses_nothing(
    model: tuple[Path, Reference],
) -> None:
    """The supervisor restarts a replica's session while batches are in flight; the new
    session runs the batch the old one held, and every answer is still right."""
    path, ref = model
    kills = 0

    async def killer(runner: ModelRunner) -> None:
        nonlocal kills
        replicas = runner._replicas
        assert replicas is not None
        # The replicas that hold batches: a replica standing by (replica 1 on two cores) runs
        # none, so a restart of its session would be one without progress.
        serving = [r for r in range(2) if not replicas.standing_by(r)]
        while True:
            await anyio.sleep(0.02)
            await replicas.replica_supervisor(serving[kills % len(serving)]).restart_child(
                "session"
            )
            kills += 1

    # Enough requests that the load outlasts several kills (a restart takes up to ~0.15 s;
    # the runtime answers ~10k of these requests per second here).
    out = await drive(path, ref, config(""), callers=200, per_caller=40, side_task=killer)
    assert_nothing_lost(out)
    assert out.failed == 0, f"failed requests: {dict(out.errors)}"
    assert kills > 3
