"""Overload at the real daemon (issue 19): does it shed early and fast with its defaults, and
recover at once?

Starts the daemon (a subprocess, default configuration) serving an MLP 784-512-512-10 compiled
at batch 32, and drives it with an aiohttp load generator that checks every answer (the logits
of the sample sent, against onnxruntime's):

1. closed loop, 32 clients: capacity C (requests/s) and its p50/p99;
2. open loop at 3xC for 30 s, each request with a 10 s client timeout: client timeouts,
   connection resets, 200s, refusals (503), p50/p99 of each, goodput (correct 200s/s) / C, the
   daemon's RSS growth;
3. open loop at 0.5xC for 10 s: seconds until p99 is back to normal (2x the closed-loop p99,
   per 0.5 s of sends, and staying there);
4. 8 closed-loop clients alone, then beside 3,000 idle keep-alive connections: throughput.

``--seconds S`` sets the overload phase (default 30); the others scale with it. Results:
``benchmarks/results/overload.json`` and ``overload.md``. Run: ``make bench-overload``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnxruntime as ort
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from test_daemon_support import running  # noqa: E402

from model_runtime.server.connections import raise_open_file_limit  # noqa: E402
from tests.models import make_mlp, save  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CLIENT_TIMEOUT = 10.0
CLOSED_CLIENTS = 32
IDLE_CONNECTIONS = 3000
ACTIVE_CLIENTS = 8
BUCKET = 0.5
OPEN_CONNECTIONS = 1024


@dataclass
class Samples:
    bodies: list[bytes]
    expected: list[np.ndarray]

    @classmethod
    def make(cls, model: Path, n: int = 64) -> Samples:
        x = np.random.default_rng(1).standard_normal((n, 784)).astype(np.float32)
        ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        logits = ref.run(None, {"x": x})[0]
        bodies = [
            orjson.dumps(
                {
                    "inputs": [
                        {"name": "x", "datatype": "FP32", "shape": [1, 784], "data": row.tolist()}
                    ]
                }
            )
            for row in x
        ]
        return cls(bodies, list(logits))

    def correct(self, i: int, body: bytes) -> bool:
        out = orjson.loads(body)["outputs"][0]["data"]
        return bool(np.allclose(out, self.expected[i], rtol=1e-3, atol=1e-4))


@dataclass
class Tally:
    """Every request of a phase: when it was sent, how it ended, how long it took."""

    sent: list[float] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)

    def add(self, t_sent: float, kind: str, seconds: float) -> None:
        self.sent.append(t_sent)
        self.kind.append(kind)
        self.latency.append(seconds)

    def count(self, kind: str) -> int:
        return sum(1 for k in self.kind if k == kind)

    def pct(self, kind: str, q: float) -> float | None:
        lat = [s for s, k in zip(self.latency, self.kind, strict=True) if k == kind]
        return round(float(np.percentile(lat, q)) * 1e3, 2) if lat else None


async def one(
    session: aiohttp.ClientSession, url: str, samples: Samples, i: int, tally: Tally
) -> None:
    t0 = time.perf_counter()
    kind = "error"
    try:
        async with asyncio.timeout(CLIENT_TIMEOUT):
            async with session.post(
                url, data=samples.bodies[i], headers={"Content-Type": "application/json"}
            ) as r:
                body = await r.read()
                if r.status == 200:
                    kind = "ok" if samples.correct(i, body) else "wrong"
                elif r.status == 503:
                    kind = "refused"
                else:
                    kind = f"status_{r.status}"
    except TimeoutError:
        kind = "timeout"
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError):
        kind = "reset"
    except aiohttp.ClientError as exc:
        kind = f"client_error_{type(exc).__name__}"
    tally.add(t0, kind, time.perf_counter() - t0)


async def closed_loop(url: str, samples: Samples, clients: int, seconds: float) -> Tally:
    tally = Tally()
    stop = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def worker(w: int) -> None:
            i = w
            while time.perf_counter() < stop:
                await one(session, url, samples, i % len(samples.bodies), tally)
                i += clients

        await asyncio.gather(*(worker(w) for w in range(clients)))
    return tally


async def open_loop(
    session: aiohttp.ClientSession, url: str, samples: Samples, rate: float, seconds: float
) -> tuple[Tally, float]:
    """``rate`` requests/s for ``seconds``, whatever the answers; returns the tally and the
    largest lag of the generator behind its schedule (s)."""
    tally = Tally()
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter()
    sent = 0
    lag = 0.0
    while (now := time.perf_counter()) - t0 < seconds:
        due = int((now - t0) * rate)
        lag = max(lag, (due - sent) / rate)
        for _ in range(due - sent):
            task = asyncio.create_task(one(session, url, samples, sent % 64, tally))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        await asyncio.sleep(0.001)
    if tasks:
        await asyncio.wait(tasks)
    return tally, lag


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def summary(tally: Tally, seconds: float) -> dict[str, Any]:
    kinds = sorted(set(tally.kind))
    return {
        "requests": len(tally.kind),
        **{k: tally.count(k) for k in kinds},
        "p50_ok_ms": tally.pct("ok", 50),
        "p99_ok_ms": tally.pct("ok", 99),
        "p50_refused_ms": tally.pct("refused", 50),
        "p99_refused_ms": tally.pct("refused", 99),
        "goodput_rps": round(tally.count("ok") / seconds, 1),
    }


def recovery_seconds(tally: Tally, normal_ms: float) -> float | None:
    """Seconds from the start of the phase to the start of the first 0.5 s bucket (by send
    time) from which every bucket's p99 is within ``normal_ms``, with no timeouts or resets
    (None: never)."""
    t0 = min(tally.sent)
    buckets: dict[int, list[tuple[str, float]]] = {}
    for s, k, lat in zip(tally.sent, tally.kind, tally.latency, strict=True):
        buckets.setdefault(int((s - t0) / BUCKET), []).append((k, lat))
    good = {
        b: all(k in ("ok", "refused") for k, _ in v)
        and float(np.percentile([lat for _, lat in v], 99)) * 1e3 <= normal_ms
        for b, v in buckets.items()
    }
    last_bad = max((b for b, ok in good.items() if not ok), default=-1)
    if last_bad == max(good):
        return None
    return (last_bad + 1) * BUCKET


async def idle_scenario(url: str, port: int, samples: Samples, seconds: float) -> dict[str, Any]:
    alone = await closed_loop(url, samples, ACTIVE_CLIENTS, seconds)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    opened = failed = 0
    for start in range(0, IDLE_CONNECTIONS, 100):

        async def keep_alive() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                return reader, writer
            except (OSError, TimeoutError, asyncio.IncompleteReadError, IndexError):
                return None

        n = min(100, IDLE_CONNECTIONS - start)
        for conn in await asyncio.gather(*(keep_alive() for _ in range(n))):
            if conn is None:
                failed += 1
            else:
                held.append(conn)
                opened += 1
    beside = await closed_loop(url, samples, ACTIVE_CLIENTS, seconds)
    still_open = sum(1 for r, _ in held if not r.at_eof())
    for _, w in held:
        w.close()
    a = alone.count("ok") / seconds
    b = beside.count("ok") / seconds
    return {
        "idle_connections_opened": opened,
        "idle_connections_failed": failed,
        "idle_connections_open_after": still_open,
        "active_clients": ACTIVE_CLIENTS,
        "rps_alone": round(a, 1),
        "rps_beside_idle": round(b, 1),
        "ratio": round(b / a, 3) if a else None,
        "errors_beside_idle": len(beside.kind) - beside.count("ok"),
    }


async def run(url: str, port: int, pid: int, samples: Samples, seconds: float) -> dict[str, Any]:
    half_seconds = max(3.0, seconds / 3)
    closed_seconds = max(3.0, seconds / 3)
    await closed_loop(url, samples, CLOSED_CLIENTS, 1.0)  # warm up
    closed = await closed_loop(url, samples, CLOSED_CLIENTS, closed_seconds)
    capacity = closed.count("ok") / closed_seconds
    closed_p99 = closed.pct("ok", 99) or 0.0
    result: dict[str, Any] = {
        "closed_loop": {"clients": CLOSED_CLIENTS, "seconds": closed_seconds}
        | summary(closed, closed_seconds),
        "capacity_rps": round(capacity, 1),
    }
    rss0 = rss_mb(pid)
    # Connections are reused (up to OPEN_CONNECTIONS at once): a request waiting for one
    # waits at the client, inside its 10 s timeout and its latency.
    conn = aiohttp.TCPConnector(limit=OPEN_CONNECTIONS)
    async with aiohttp.ClientSession(connector=conn) as session:
        cpu0, me0 = cpu_seconds(pid), cpu_seconds(os.getpid())
        over, lag = await open_loop(session, url, samples, 3 * capacity, seconds)
        cpu1, me1 = cpu_seconds(pid), cpu_seconds(os.getpid())
        rss1 = rss_mb(pid)
        half, lag_half = await open_loop(session, url, samples, 0.5 * capacity, half_seconds)
    overload = summary(over, seconds)
    overload |= {
        "rate_rps": round(3 * capacity, 1),
        "seconds": seconds,
        "goodput_ratio": round(over.count("ok") / seconds / capacity, 3),
        "p99_ok_vs_closed_p99": round((over.pct("ok", 99) or 0) / closed_p99, 2),
        "p99_refused_vs_closed_p99": round((over.pct("refused", 99) or 0) / closed_p99, 2),
        "generator_max_lag_s": round(lag, 3),
        "daemon_cpu_share": round((cpu1 - cpu0) / seconds, 2),
        "client_cpu_share": round((me1 - me0) / seconds, 2),
        "rss_before_mb": round(rss0, 1),
        "rss_after_mb": round(rss1, 1),
        "rss_growth_mb": round(rss1 - rss0, 1),
    }
    normal = 2 * closed_p99
    result["overload_3x"] = overload
    result["after_half"] = summary(half, half_seconds) | {
        "rate_rps": round(0.5 * capacity, 1),
        "seconds": half_seconds,
        "normal_p99_ms": round(normal, 2),
        "seconds_to_normal_p99": recovery_seconds(half, normal),
        "generator_max_lag_s": round(lag_half, 3),
    }
    result["idle_keepalive"] = await idle_scenario(url, port, samples, max(3.0, seconds / 6))
    return result


def markdown(r: dict[str, Any], command: str) -> str:
    c, o, h, i = r["closed_loop"], r["overload_3x"], r["after_half"], r["idle_keepalive"]
    return "\n".join(
        [
            "## Overload (issue 19)",
            "",
            f"`{command}` — the daemon with its defaults, MLP 784-512-512-10 at batch 32, "
            "single-sample JSON requests, every answer checked; client and daemon share the "
            "2-core machine (noisy).",
            "",
            *(
                [
                    f"**The load generator did not hold 3xC** (it fell {o['generator_max_lag_s']}"
                    " s behind its schedule): the figures below measure the client on this "
                    "machine as much as the daemon.",
                    "",
                ]
                if o["generator_max_lag_s"] > 0.1
                else []
            ),
            "| figure | value | goal |",
            "| --- | --- | --- |",
            f"| closed-loop capacity C ({c['clients']} clients) | {r['capacity_rps']} req/s, "
            f"p50 {c['p50_ok_ms']} ms, p99 {c['p99_ok_ms']} ms | |",
            f"| open loop 3xC for {o['seconds']} s: requests | {o['requests']} at "
            f"{o['rate_rps']} req/s (generator lag max {o['generator_max_lag_s']} s; CPU "
            f"cores used: daemon {o['daemon_cpu_share']}, client {o['client_cpu_share']}) | |",
            f"| client timeouts (10 s) | {o.get('timeout', 0)} | 0 |",
            f"| connection resets | {o.get('reset', 0)} | 0 |",
            f"| 200s (correct / wrong) | {o.get('ok', 0)} / {o.get('wrong', 0)} | |",
            f"| refusals (503) | {o.get('refused', 0)} | |",
            f"| p50 / p99 of 200s | {o['p50_ok_ms']} / {o['p99_ok_ms']} ms "
            f"({o['p99_ok_vs_closed_p99']}x closed p99) | p99 <= 10x |",
            f"| p50 / p99 of refusals | {o['p50_refused_ms']} / {o['p99_refused_ms']} ms "
            f"({o['p99_refused_vs_closed_p99']}x closed p99) | p99 <= 10x |",
            f"| goodput | {o['goodput_rps']} req/s = {o['goodput_ratio']}xC | >= 0.8xC |",
            f"| daemon RSS growth | {o['rss_growth_mb']} MB ({o['rss_before_mb']} -> "
            f"{o['rss_after_mb']}) | < 200 MB |",
            f"| then 0.5xC for {h['seconds']} s: p99 back under {h['normal_p99_ms']} ms "
            f"(2x closed p99) after | {h['seconds_to_normal_p99']} s (p99 {h['p99_ok_ms']} ms, "
            f"timeouts {h.get('timeout', 0)}, refusals {h.get('refused', 0)}) | <= 5 s |",
            f"| {i['active_clients']} active clients, alone / beside "
            f"{i['idle_connections_opened']} idle keep-alive connections | {i['rps_alone']} / "
            f"{i['rps_beside_idle']} req/s = {i['ratio']} (idle still open after: "
            f"{i['idle_connections_open_after']}, failed to open: "
            f"{i['idle_connections_failed']}) | >= 0.5 |",
            "",
        ]
    )


def rewrite_markdown(out: Path = RESULTS) -> None:
    """Write ``overload.md`` again from ``overload.json`` (same run, no new measurement)."""
    result = json.loads((out / "overload.json").read_text())
    (out / "overload.md").write_text(markdown(result, result["command"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="overload phase (30)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    raise_open_file_limit()  # the client holds thousands of sockets too
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        uvloop = None  # type: ignore[assignment]
    with tempfile.TemporaryDirectory(prefix="mr-overload-") as tmp:
        work = Path(tmp)
        model = save(make_mlp(), work / "mlp.onnx")
        samples = Samples.make(model)
        with running(work, f"mlp={model}", "--batch-size", "32") as daemon:
            url = daemon.url("/v2/models/mlp/infer")
            coro = run(url, daemon.port, daemon.proc.pid, samples, args.seconds)
            result = uvloop.run(coro) if uvloop is not None else asyncio.run(coro)
            events = daemon.events()
        result["daemon_log"] = {
            "requests_refused_summaries": sum(
                1 for e in events if e.get("event") == "requests_refused"
            ),
            "warnings": sum(1 for e in events if e.get("level") == "warning"),
            "errors": sum(1 for e in events if e.get("level") == "error"),
        }
    command = "make bench-overload" + (
        f" OVERLOAD_SECONDS={args.seconds:g}" if args.seconds != 30 else ""
    )
    result["command"] = command
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overload.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result, command)
    (args.out / "overload.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
