"""Triton's metrics and statistics from the real daemon (a subprocess on loopback): after N
inferences ``/metrics`` has the ``nv_inference_*`` names with the right counts and the labels
``model`` and ``version``; they do not reset when the model is reloaded (explicit control mode:
load again); the statistics extension has ``batch_stats``; process metrics are there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.runner_support import compile_to
from tests.integration.test_daemon_support import Daemon, metric, running
from tests.models import make_mlp

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

WIDTH = 16
BATCH = 4
LABELS = '{model="m",version="1"}'
COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def doc(rows: int = 1, width: int = WIDTH) -> dict[str, Any]:
    x = np.ones((rows, width), np.float32).ravel().tolist()
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, width], "data": x}]}


def infer(d: Daemon, n: int, rows: int = 1) -> None:
    for _ in range(n):  # one at a time: each request is one execution
        status, out = d.post("/v2/models/m/infer", doc(rows))
        assert status == 200, out


def scrape(d: Daemon) -> dict[str, float]:
    status, text = d.get("/metrics")
    assert status == 200
    for name in COUNTERS:
        assert f"# TYPE {name} counter" in text, name
        assert f"{name}_total" not in text  # Triton's names, not prometheus_client's
    assert "# TYPE nv_inference_pending_request_count gauge" in text
    assert metric(text, "process_cpu_seconds_total") is not None  # process metrics
    out = {}
    for name in (*COUNTERS, "nv_inference_pending_request_count"):
        if name == "nv_inference_request_failure":  # Triton's reason label: their sum
            reasons = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
            values = [metric(text, f'{name}{LABELS[:-1]},reason="{r}"}} ') for r in reasons]
            assert None not in values, (name, text)
            out[name] = sum(v for v in values if v is not None)
            out[f"{name}_other"] = values[-1] or 0.0
            continue
        value = metric(text, f"{name}{LABELS} ")
        assert value is not None, (name, text)
        out[name] = value
    return out


def test_triton_metrics_count_and_survive_a_reload(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    compile_to(make_mlp(sizes=(WIDTH, 8, 3), seed=1), repo, name="m", batch_size=BATCH)
    args = ("--model-repository", str(repo), "--model-control-mode", "explicit")
    with running(tmp_path, *args, "--load-model", "m") as d:
        infer(d, 5)
        infer(d, 2, rows=3)
        status, _ = d.post("/v2/models/m/infer", doc(1, WIDTH + 1))  # wrong shape: a failure
        assert status == 400
        m = scrape(d)
        assert m["nv_inference_request_success"] == 7
        assert m["nv_inference_request_failure"] == m["nv_inference_request_failure_other"] == 1
        assert m["nv_inference_count"] == 5 + 2 * 3  # samples
        assert m["nv_inference_exec_count"] == 7
        assert m["nv_inference_pending_request_count"] == 0
        for name in ("request", "queue", "compute_input", "compute_infer"):
            assert m[f"nv_inference_{name}_duration_us"] > 0, name
        assert m["nv_inference_request_duration_us"] > m["nv_inference_compute_infer_duration_us"]

        assert d.post("/v2/repository/models/m/load")[0] == 200  # a reload: a new runner
        after_reload = scrape(d)
        for name in COUNTERS:  # nothing resets
            assert after_reload[name] >= m[name], name
        infer(d, 3)
        n = scrape(d)
        assert (n["nv_inference_request_success"], n["nv_inference_count"]) == (10, 14)
        assert (n["nv_inference_exec_count"], n["nv_inference_request_failure"]) == (10, 1)
        assert (
            n["nv_inference_compute_infer_duration_us"]
            > m["nv_inference_compute_infer_duration_us"]
        )

        status, stats = d.get("/v2/models/m/stats")
        assert status == 200
        (s,) = stats["model_stats"]
        assert (s["name"], s["version"], s["execution_count"]) == ("m", "1", 10)
        assert s["inference_stats"]["success"]["count"] == 10
        assert s["inference_stats"]["queue"]["count"] == 10
        # By the batch size each run executed (a bucket of the executable, or its batch).
        batches = s["batch_stats"]
        assert sum(b["compute_infer"]["count"] for b in batches) == 10
        for b in batches:
            assert 1 <= b["batch_size"] <= BATCH
            assert b["compute_infer"]["ns"] > 0 and b["compute_output"]["ns"] > 0
            counts = {b[k]["count"] for k in ("compute_input", "compute_infer", "compute_output")}
            assert len(counts) == 1, b
        # perf_analyzer refuses statistics whose compute counts differ ("Server side
        # statistics compute counts must be the same"): every request counts once in each.
        phases = ("queue", "compute_input", "compute_infer", "compute_output")
        inference = s["inference_stats"]
        assert {inference[p]["count"] for p in phases} == {10}, inference
        assert all(inference[p]["ns"] > 0 for p in phases), inference


def test_what_a_runner_ran_is_counted_when_a_reload_or_unload_retires_it(tmp_path: Path) -> None:
    """No scrape between the inferences and the reload: the swapped-out runner is read as it
    retires, so its last executions (and their durations) reach the totals; an unload alike."""
    repo = tmp_path / "models"
    repo.mkdir()
    compile_to(make_mlp(sizes=(WIDTH, 8, 3), seed=1), repo, name="m", batch_size=BATCH)
    args = ("--model-repository", str(repo), "--model-control-mode", "explicit")
    with running(tmp_path, *args, "--load-model", "m") as d:
        infer(d, 6)
        assert d.post("/v2/repository/models/m/load")[0] == 200  # a reload, then the scrape
        m = scrape(d)
        assert (m["nv_inference_request_success"], m["nv_inference_exec_count"]) == (6, 6)
        assert m["nv_inference_queue_duration_us"] > 0
        assert m["nv_inference_compute_infer_duration_us"] > 0
        infer(d, 2)
        assert d.post("/v2/repository/models/m/unload")[0] == 200
        assert scrape(d)["nv_inference_exec_count"] == 8  # unloaded: its totals stay
        assert d.post("/v2/repository/models/m/load")[0] == 200
        infer(d, 1)
        assert scrape(d)["nv_inference_exec_count"] == 9
