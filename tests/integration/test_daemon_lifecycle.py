"""The real daemon under faults and signals: truthful readiness during resets and failures,
SIGTERM drains with requests in flight, a client disconnect cancels its request."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from test_daemon_support import MODEL, infer_doc, metric, running, samples, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


async def _post(s: aiohttp.ClientSession, url: str, doc: object) -> int:
    async with s.post(url, json=doc) as resp:
        await resp.read()
        return resp.status


def test_recoverable_faults_are_retried_and_counted(tmp_path: Path) -> None:
    pixels, logits = samples()
    with running(tmp_path, "--fault-plan", "recoverable:every=5", "--auto-reset") as d:
        for i in range(20):
            status, out = d.post(f"/v2/models/{MODEL}/infer", infer_doc(pixels[i : i + 1]))
            assert status == 200, out
            got = np.array(out["outputs"][0]["data"], np.float32)
            np.testing.assert_allclose(got, logits[i], atol=1e-4)
        text = d.get("/metrics")[1]
        assert (
            metric(text, f'model_runtime_replica_resets{{model="{MODEL}",replica="0"}}') or 0
        ) >= 1
        assert d.get("/v2/health/ready")[0] == 200


def test_readiness_goes_false_when_every_replica_failed(tmp_path: Path) -> None:
    pixels, _ = samples()
    with running(tmp_path, "--fault-plan", "fatal:at=2", "--no-auto-reset") as d:
        assert d.post(f"/v2/models/{MODEL}/infer", infer_doc(pixels[:1]))[0] == 200
        status, out = d.post(f"/v2/models/{MODEL}/infer", infer_doc(pixels[:1]))
        assert status in (500, 503), out
        wait_for(lambda: d.get("/v2/health/ready")[0] == 503, 10, "readiness to turn false")
        status, out = d.get(f"/v2/models/{MODEL}/ready")
        assert status == 503 and out["ready"] is False and "failed" in out["error"]
        text = d.get("/metrics")[1]
        assert f'model="{MODEL}",replica="0",state="failed"}} 1.0' in text
        assert f'model_runtime_model_ready{{model="{MODEL}"}} 0.0' in text
        assert d.get("/v2/health/live")[0] == 200  # alive, but says it cannot serve


def test_one_failed_replica_of_two_keeps_the_model_ready(tmp_path: Path) -> None:
    pixels, logits = samples()
    args = ("--replicas", "2", "--fault-plan", "fatal:at=1:replica=0", "--no-auto-reset")
    with running(tmp_path, *args) as d:
        statuses = [
            d.post(f"/v2/models/{MODEL}/infer", infer_doc(pixels[i : i + 1]))[0] for i in range(6)
        ]
        assert statuses.count(200) >= 4 and set(statuses) <= {200, 500, 503}, statuses
        wait_for(
            lambda: f'model="{MODEL}",replica="0",state="failed"}} 1.0' in d.get("/metrics")[1],
            10,
            "replica 0 to be reported failed",
        )
        text = d.get("/metrics")[1]
        assert f'model="{MODEL}",replica="1",state="ready"}} 1.0' in text
        assert d.get("/v2/health/ready")[0] == 200
        assert d.get(f"/v2/models/{MODEL}/ready")[0] == 200
        status, out = d.post(f"/v2/models/{MODEL}/infer", infer_doc(pixels[:3]))
        assert status == 200
        got = np.array(out["outputs"][0]["data"], np.float32).reshape(3, 10)
        np.testing.assert_allclose(got, logits[:3], atol=1e-4)


async def test_readiness_flips_during_a_hang_reset(tmp_path: Path) -> None:
    """Run 2 hangs; the watchdog resets the device; the model goes not-ready for the reset
    (logged and counted, however short: a device reset here takes about a millisecond, too
    short to catch by polling), the request is retried and answered, the model is ready."""
    pixels, logits = samples()
    args = ("--fault-plan", "hang:at=2", "--execution-timeout", "0.5", "--auto-reset")
    with running(tmp_path, *args) as d:
        url = d.url(f"/v2/models/{MODEL}/infer")
        async with aiohttp.ClientSession() as s:
            assert await _post(s, url, infer_doc(pixels[:1])) == 200
            t0 = time.monotonic()
            async with s.post(url, json=infer_doc(pixels[1:2])) as resp:
                assert resp.status == 200
                out = await resp.json()
            assert time.monotonic() - t0 >= 0.5  # it did hang until the watchdog acted
            got = np.array(out["outputs"][0]["data"], np.float32)
            np.testing.assert_allclose(got, logits[1], atol=1e-4)
            async with s.get(d.url(f"/v2/models/{MODEL}/ready")) as resp:
                assert resp.status == 200
        changes = [
            (e["ready"], e["replicas"])
            for e in d.events()
            if e.get("event") == "model_readiness_changed"
        ]
        assert changes == [(False, ["resetting"]), (True, ["ready"])]
        text = d.get("/metrics")[1]
        prefix = f'model_runtime_model_readiness_changes_total{{model="{MODEL}",ready='
        assert metric(text, prefix + '"false"}') == 1
        assert metric(text, prefix + '"true"}') == 1
        assert (
            metric(text, f'model_runtime_replica_resets{{model="{MODEL}",replica="0"}}') or 0
        ) >= 1


async def test_sigterm_drains_requests_in_flight(tmp_path: Path) -> None:
    pixels, _ = samples()
    args = ("--fault-plan", "slow:every=1:seconds=0.4", "--grace-period", "20")
    with running(tmp_path, *args) as d:
        url = d.url(f"/v2/models/{MODEL}/infer")
        async with aiohttp.ClientSession() as s:
            tasks = [
                asyncio.ensure_future(_post(s, url, infer_doc(pixels[i : i + 2])))
                for i in range(12)
            ]

            def pending() -> float:
                return metric(d.get("/metrics")[1], "model_runtime_pending_requests{") or 0

            await asyncio.to_thread(wait_for, lambda: pending() >= 12, 20, "12 requests in flight")
            t0 = time.monotonic()
            d.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(
                wait_for,
                lambda: any(e.get("event") == "daemon_draining" for e in d.events()),
                10,
                "the drain to start",
            )
            late = await _post(s, url, infer_doc(pixels[:1]))
            results = await asyncio.gather(*tasks)
        assert late == 503
        assert results == [200] * 12
        assert await asyncio.to_thread(d.proc.wait, 20) == 0
        assert time.monotonic() - t0 < 20
        events = [e.get("event") for e in d.events()]
        assert events.index("daemon_draining") < events.index("daemon_stopped")
        assert "runner_stopped" in events


def test_a_request_past_its_deadline_is_answered_503_on_time(tmp_path: Path) -> None:
    # The runner's own timer answers it (the server sets none of its own for a ModelRunner):
    # Triton's 503 "Request timeout expired" at its 0.2 s deadline, not the slow run's answer
    # 2 s later.
    pixels, _ = samples()
    with running(tmp_path, "--fault-plan", "slow:every=1:seconds=2") as d:
        t0 = time.monotonic()
        status, body = d.post(
            f"/v2/models/{MODEL}/infer", infer_doc(pixels[:1], parameters={"timeout": 200_000})
        )
        elapsed = time.monotonic() - t0
        assert status == 503 and body["error"].startswith("Request timeout expired"), body
        assert 0.2 <= elapsed < 1.5


async def test_client_disconnect_cancels_its_request(tmp_path: Path) -> None:
    pixels, _ = samples()
    with running(tmp_path, "--fault-plan", "slow:every=1:seconds=2") as d:
        url = d.url(f"/v2/models/{MODEL}/infer")
        async with aiohttp.ClientSession() as s:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await s.post(
                        url, json=infer_doc(pixels[:1]), headers={"X-Request-ID": "gone-1"}
                    )

        line = (
            f'model_runtime_requests_total{{model="{MODEL}",outcome="failure",reason="cancelled"}}'
        )

        def cancelled() -> bool:
            return (metric(d.get("/metrics")[1], line) or 0) >= 1

        await asyncio.to_thread(wait_for, cancelled, 10, "the request to be cancelled")
        text = d.get("/metrics")[1]
        assert metric(text, f'model_runtime_pending_requests{{model="{MODEL}"}}') == 0
        logged = [e for e in d.events() if e.get("event") == "request_cancelled"]
        assert logged and logged[0]["request_id"] == "gone-1" and logged[0]["model"] == MODEL
