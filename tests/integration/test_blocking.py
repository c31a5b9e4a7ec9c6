"""``BlockingModelRunner``: the async runner's surface for synchronous code, from any thread."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path

import numpy as np
import pytest

from actors.session.state import ReplicaStatus
from model_runtime.blocking import BlockingModelRunner
from model_runtime.errors import InputValidationError, RunnerStoppedError
from model_runtime.runner import ModelRunnerConfig
from tests.integration.runner_support import Reference, compile_to
from tests.models import make_mlp

pytestmark = pytest.mark.timeout(60)

SIZES = (16, 24, 5)
BATCH = 4
WAIT = 20.0  # seconds a test waits for an answer before it fails


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Reference]:
    model = make_mlp(sizes=SIZES, seed=5)
    # One batch size: the tests below rely on the seed's fixed batch (a partial batch waits).
    path = compile_to(model, tmp_path_factory.mktemp("mlp"), batch_size=BATCH, batch_buckets=False)
    return path, Reference(model)


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, SIZES[0])).astype(np.float32)


def assert_rows(got: dict[str, np.ndarray], x: np.ndarray, ref: Reference) -> None:
    np.testing.assert_allclose(got["logits"], ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)


def test_execute_async_returns_a_future_without_waiting_for_the_batch(
    mlp: tuple[Path, Reference],
) -> None:
    path, ref = mlp
    # timeout=0: a partial batch waits for rows forever, so only the rows that follow can
    # complete the first request; had execute_async waited for it, this would never return.
    config = ModelRunnerConfig(batching_dim=0, timeout=0.0)
    with BlockingModelRunner(path, config) as runner:
        xs = [rows(1, seed=i) for i in range(BATCH)]
        submitted: list[concurrent.futures.Future[dict[str, np.ndarray]]] = []
        submitter = threading.Thread(
            target=lambda: submitted.append(runner.execute_async({"x": xs[0]}))
        )
        submitter.start()
        submitter.join(WAIT)
        assert not submitter.is_alive(), "execute_async waited for the outputs"
        first = submitted[0]
        assert isinstance(first, concurrent.futures.Future)
        assert not first.done(), "one row of a batch of four is not computed alone"
        rest = [runner.execute_async({"x": x}) for x in xs[1:]]
        for x, future in zip(xs, [first, *rest], strict=True):
            assert_rows(future.result(WAIT), x, ref)
        assert runner.replica_states()[0].runs == 1, "the four requests shared one batch"


def test_execute_async_from_many_threads_each_gets_its_rows(mlp: tuple[Path, Reference]) -> None:
    path, ref = mlp
    config = ModelRunnerConfig(replication_factor=2, batching_dim=0, timeout=0.001)
    per_thread = 40
    futures: dict[int, list[tuple[np.ndarray, concurrent.futures.Future[dict[str, np.ndarray]]]]]
    futures = {}
    with BlockingModelRunner(path, config) as runner:

        def submit_all(t: int) -> None:  # submit everything first, wait afterwards
            futures[t] = [
                (x, runner.execute_async({"x": x}))
                for x in (rows(1 + i % 3, seed=1000 * t + i) for i in range(per_thread))
            ]

        threads = [threading.Thread(target=submit_all, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(WAIT)
        for t in range(6):
            for x, future in futures[t]:
                assert_rows(future.result(WAIT), x, ref)
        counts = [
            runner.get_monitoring_statistics_total_count(r)["request_monitoring_statistics_count"]
            for r in range(2)
        ]
    assert sum(counts) == 6 * per_thread


def test_execute_async_errors_arrive_in_the_future_of_that_request_only(
    mlp: tuple[Path, Reference],
) -> None:
    path, ref = mlp
    with BlockingModelRunner(path, ModelRunnerConfig(batching_dim=0, timeout=0.0)) as runner:
        xs = [rows(2, seed=i) for i in range(2)]
        good = runner.execute_async({"x": xs[0]})
        bad = runner.execute_async({"x": rows(2, seed=9).astype(np.float64)})
        withdrawn = runner.execute_async({"x": rows(1, seed=8)})
        assert withdrawn.cancel(), "three rows of four: it cannot have completed"
        more = runner.execute_async({"x": xs[1]})
        error = bad.exception(WAIT)
        assert isinstance(error, InputValidationError)
        assert "input 'x' has dtype float64" in str(error)
        # Four rows complete the batch: neither the refused nor the withdrawn request is in it.
        assert_rows(good.result(WAIT), xs[0], ref)
        assert_rows(more.result(WAIT), xs[1], ref)
        assert withdrawn.cancelled()
        assert runner.replica_states()[0].runs == 1
    with pytest.raises(RunnerStoppedError):
        runner.execute_async({"x": xs[0]})


def test_statistics_descriptions_and_status_mirror_the_async_runner(
    mlp: tuple[Path, Reference],
) -> None:
    path, _ = mlp
    config = ModelRunnerConfig(batching_dim=0, timeout=0.001)
    runner = BlockingModelRunner(path, config)
    assert runner.config is config
    assert not runner.is_ready and runner.replica_status() == []
    with pytest.raises(RunnerStoppedError):
        runner.get_monitoring_statistics_mean()
    with pytest.raises(RunnerStoppedError):
        runner.get_execute_inputs()  # nothing is loaded before start
    with runner:
        assert runner.is_ready
        assert runner.replica_status() == [ReplicaStatus.READY]
        assert runner.executable.metadata.model_name == runner.runner.executable.metadata.model_name
        assert [(d.name, d.shape) for d in runner.get_execute_inputs()] == [("x", (BATCH, 16))]
        assert [(d.name, d.shape) for d in runner.get_execute_outputs()] == [("logits", (BATCH, 5))]
        model_inputs = {d.name for d in runner.get_model_inputs()}
        assert {"x", "w0", "b0", "w1", "b1"} <= model_inputs, "weights are model inputs"
        assert {d.name for d in runner.get_model_outputs()} == {"logits"}
        assert runner.get_time_trace() == {}, "no request yet"
        for i in range(5):
            runner.execute({"x": rows(2, seed=i)})
        count = runner.get_monitoring_statistics_total_count()
        assert count["request_monitoring_statistics_count"] == 5
        trace = runner.get_time_trace()
        assert set(trace) == {
            "request_duration_us",
            "read_preparation_duration_us",
            "read_queue_duration_us",
            "computation_duration_us",
            "output_duration_us",
        }
        assert trace["request_duration_us"] >= trace["computation_duration_us"] > 0
        mean = runner.get_monitoring_statistics_mean()
        p50 = runner.get_monitoring_statistics_percentile(0.5)
        assert mean["request_monitoring_statistics_mean_us"] > 0
        assert p50["request_monitoring_statistics_percentile_us"] > 0
        with pytest.raises(InputValidationError, match="replica_id 1 is out of range"):
            runner.get_time_trace(replica_id=1)
    assert not runner.is_ready
    assert runner.replica_status() == [ReplicaStatus.STOPPED]
    with pytest.raises(RunnerStoppedError):
        runner.get_monitoring_statistics_total_count()
