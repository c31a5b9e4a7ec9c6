"""A model costs its weights once, and says what it holds (issue 34).

Replicas of one model run one onnxruntime session (built once, shared), the runner releases the
executable's copy of the weights the session holds, both replicas answer right after one of
them is reset by the fault plan and after the other's actor crashed and restarted (the file
truncated meanwhile), and
``ModelRunner.memory`` / ``/metrics`` report the model's weights, its shared sessions (counted
once) and what each replica adds beside them (nothing, here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from actors.device.backends.ort_sessions import live_sessions
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.integration.runner_support import Reference, compile_to
from tests.integration.test_daemon_support import metric, running
from tests.models import make_mlp

pytestmark = pytest.mark.timeout(90)

WIDTH = 16


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, WIDTH)).astype(np.float32)


async def test_two_replicas_share_one_session_through_a_reset_and_a_restart(
    tmp_path: Path,
) -> None:
    model = make_mlp(sizes=(WIDTH, 64, 3), seed=3)
    path = compile_to(model, tmp_path, batch_size=4)
    reference = Reference(model)
    # Replica 0's run 2 fails (a reset); replica 1's actor crashes on its run 2 (a restart).
    plan = "recoverable:at=2:replica=0;crash:at=2:replica=1"
    config = ModelRunnerConfig(replication_factor=2, auto_reset=True, fault_plan=plan)
    async with ModelRunner(path, config) as runner:
        hash_ = runner._executable.package_hash
        # Its weights released (they live in the session), the file goes: the reset and the
        # restart below must not need it.
        path.write_bytes(path.read_bytes()[:100])
        for k in range(6):
            for replica in (0, 1):
                x = rows(4, 10 * k + replica)
                out = await runner.execute({"x": x}, replica_id=replica)
                want = reference({"x": x})["logits"]
                np.testing.assert_allclose(out["logits"], want, rtol=1e-5, atol=1e-6)
        states = runner.replica_states()
        assert states[0].resets >= 1, "the fault plan's reset did not happen"
        assert states[1].restarts >= 1, "the fault plan's crash did not restart the replica"
        ours = [s for s in live_sessions() if s.key is not None and s.key.package_hash == hash_]
        assert len(ours) == 1, f"replicas run {len(ours)} sessions, not one"
        exe = runner._executable
        memory = runner.memory()
        # The weights live in the session: the runner released the executable's copy.
        assert exe.released == {w.name for w in exe.metadata.weights}
        assert memory["weights"] == exe.total_tensor_bytes()
        assert memory["weights"] < sum(w.tensor_info.size_in_bytes for w in exe.metadata.weights)
        assert memory["sessions"] == ours[0].built_bytes
        assert memory["replicas"] == [{"session": 0, "state": 0}] * 2


def test_metrics_say_what_a_model_and_its_replicas_hold(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    compile_to(make_mlp(sizes=(WIDTH, 64, 3), seed=1), repo, name="m", batch_size=4)
    with running(tmp_path, "--model-repository", str(repo), "--replicas", "2") as d:
        status, text = d.get("/metrics")
        assert status == 200
        weights = metric(text, 'model_runtime_model_memory_bytes{kind="weights",model="m",')
        sessions = metric(text, 'model_runtime_model_memory_bytes{kind="sessions",model="m",')
        # What the executable still holds: its programs, not the weights its session holds.
        assert weights is not None and 0 < weights < (WIDTH * 64 + 64 * 3) * 4, text
        assert sessions is not None and sessions >= 0
        for replica in ("0", "1"):
            own = metric(
                text,
                f'model_runtime_replica_memory_bytes{{kind="session",model="m",replica="{replica}"}}',
            )
            assert own == 0.0, (replica, own)
