"""benchmarks/report.py: issue 13's targets judged from the JSON results, stale and missing
results said, the README's bench block rewritten and nothing else; and the HTTP benchmark's
answer check (a wrong answer must be seen)."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import report, report_pages
from benchmarks.http_throughput import OUTPUT, _exchange, decode_output


def _dynamic(ratio: float = 2.5, runs: float = 0.2, wrong: int = 0) -> dict[str, Any]:
    return {
        "seconds": 3.0,
        "pairs": 3,
        "requests": 320,
        "rows": [
            {
                "model": "text classifier ids [batch, seq] B=32",
                "callers": 64,
                "raw_req_per_s": 1000.0,
                "runtime_req_per_s": 1000.0 * ratio,
                "runtime_over_raw": ratio,
                "pair_ratios": [ratio],
                "runs_per_request": runs,
                "answers_checked": 100,
                "answers_wrong": wrong,
            }
        ],
    }


def _docs(*, rt_over_bare: float = 0.95, http: bool = True) -> dict[str, Any]:
    rows = [
        {
            "model": "mlp 784-512-512-10 B=32",
            "config": cfg,
            "callers": 256,
            "runtime_over_bare": rt_over_bare,
            "runtime_samples_per_s": 1.0,
        }
        for cfg in ("1x1", "1x2", "2x1")
    ] + [
        {"model": "squeezenet (light) B=8", "config": "1x1", "callers": 256,
         "runtime_samples_per_s": 100.0, "runtime_over_bare": 1.0},
        {"model": "squeezenet (light) B=8", "config": "2x1", "callers": 256,
         "runtime_samples_per_s": 190.0, "runtime_over_bare": 1.0},
    ]  # fmt: skip
    docs: dict[str, Any] = {
        "runner_throughput": {
            "rows": rows,
            "lone": [
                {
                    "model": "mlp 784-512-512-10 B=32",
                    "raw_batch1_p50_us": 80.0,
                    "runtime_default_p50_us": 300.0,
                    "runtime_default_p99_us": 400.0,
                    "runtime_default_requests": 10,
                    "runtime_default_timeout_ms": 2.0,
                }
            ],
        },
        "compiled_vs_source": {
            "model": "squeezenet",
            "batch": 4,
            "rows": [{"layout": "weights as constants", "ratio": 1.04}],
        },
    }
    if http:
        docs["http_throughput"] = {
            "servers": {"kserve": {"version": "0.21.0"}},
            "rows": [
                {"server": s, "mode": "json", "clients": c, "req_per_s": rps}
                for s, c, rps in (
                    ("daemon", 1, 1000.0),
                    ("kserve", 1, 500.0),
                    ("daemon", 64, 3000.0),
                    ("mlserver", 64, 1200.0),
                )
            ],
        }
    return docs


def _verdicts(docs: dict[str, Any]) -> dict[str, str]:
    return {t.what: t.verdict for t in report.targets(docs)}


def test_targets_pass_and_fail_against_issue_13_goals() -> None:
    verdicts = _verdicts(_docs())
    assert verdicts == {
        "runtime / bare batcher, MLP 1x1, 256 callers": "PASS",
        "runtime / bare batcher, MLP 1x2, 256 callers": "PASS",
        "runtime / bare batcher, MLP 2x1, 256 callers": "PASS",
        "compiled / source time, squeezenet batch 4": "PASS",
        "one caller p50 (µs), MLP, default config": "FAIL",  # 300 > 80 + 150
        "HTTP JSON daemon / kserve, 1 client": "PASS",  # 2.0 >= 1.5
        "HTTP JSON daemon / mlserver, 64 clients": "FAIL",  # 2.5 < 3
        "squeezenet, 2 replicas / 1 replica (runtime, 256 callers)": "PASS",  # 1.9
        report.DYNAMIC_RATIO: "n/a",  # issue 29's dynamic point: not measured
        report.DYNAMIC_RUNS: "n/a",
    }
    low = _verdicts(_docs(rt_over_bare=0.87))
    assert low["runtime / bare batcher, MLP 1x1, 256 callers"] == "FAIL"
    assert low["runtime / bare batcher, MLP 2x1, 256 callers"] == "PASS"


def test_the_dynamic_point_is_judged_against_issue_29_goals() -> None:
    docs = _docs() | {"dynamic_shapes": _dynamic()}
    goals = {t.what: t for t in report.targets(docs)}
    assert goals[report.DYNAMIC_RATIO].verdict == "PASS"  # 2.5 >= 2
    assert goals[report.DYNAMIC_RUNS].verdict == "PASS"  # 0.2 <= 0.6
    assert goals[report.DYNAMIC_RATIO].issue == goals[report.DYNAMIC_RUNS].issue == 29
    slow = _verdicts(_docs() | {"dynamic_shapes": _dynamic(ratio=1.9, runs=0.7)})
    assert slow[report.DYNAMIC_RATIO] == slow[report.DYNAMIC_RUNS] == "FAIL"
    wrong = {t.what: t for t in report.targets(_docs() | {"dynamic_shapes": _dynamic(wrong=2)})}
    assert wrong[report.DYNAMIC_RATIO].verdict == "FAIL"  # fast, but an answer differs
    assert "2 wrong" in wrong[report.DYNAMIC_RATIO].goal
    lines = report.headline(docs, report.targets(docs))
    assert "- issue 13 targets: 6 of 8 PASS (0 not measured)" in lines
    assert "- issue 29 targets: 2 of 2 PASS (0 not measured)" in lines
    assert any("dynamic text classifier" in line and "2.50x" in line for line in lines)
    text = report.render(docs, [], {}, {}, None, datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC))
    assert "## Dynamic shapes" in text and f"| {report.DYNAMIC_RATIO} | 29 | 2.50 |" in text


def test_memory_is_judged_against_issue_34_goals_per_setup() -> None:
    rows = [{"models": 1, "replicas": 1, "rss": 100 * 2**20, "metrics": {}}]
    setup = {"model": "mlp 1-2-3 (x)", "weights_bytes": 2**20, "rows": rows}
    doc = {
        "devices": "cpu:2x1",
        "batch": 8,
        "repeat": 3,
        "setups": {
            "small": setup | {"per_model_w": 1.4, "per_replica_w": 0.1},
            "large": setup | {"per_model_w": 1.2, "per_replica_w": None},
        },
    }
    goals = {t.what: t for t in report.memory_targets({"memory": doc})}
    verdicts = [(t.issue, t.verdict) for t in goals.values()]
    assert verdicts == [(34, "FAIL"), (34, "PASS"), (34, "PASS"), (34, "n/a")]
    assert [t.verdict for t in report.memory_targets({})] == ["n/a", "n/a"]
    text = report.render(
        {"memory": doc}, [], {}, {}, None, datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)
    )
    assert (
        "## Memory (issue 34)" in text and "| small (W 1.00 MB) | 1 | 1 | 100.0 | 100.0 |" in text
    )


def test_a_peer_not_measured_is_na_not_pass() -> None:
    verdicts = _verdicts(_docs(http=False))
    assert verdicts["HTTP JSON daemon / kserve, 1 client"] == "n/a"
    assert verdicts["HTTP JSON daemon / mlserver, 64 clients"] == "n/a"
    assert _verdicts({})["runtime / bare batcher, MLP 1x1, 256 callers"] == "n/a"


def test_missing_and_stale_results_are_said(tmp_path: Path) -> None:
    docs = _docs()
    for name in ("runner_throughput", "compiled_vs_source"):
        (tmp_path / f"{name}.json").write_text(json.dumps(docs[name]))
    old = tmp_path / "compiled_vs_source.json"
    os.utime(old, (1000.0, 1000.0))
    loaded, notes = report.load(tmp_path, since=2000.0)
    assert set(loaded) == {"runner_throughput", "compiled_vs_source"}
    assert any("http_throughput" in n and "no results" in n for n in notes)
    assert any("dynamic_shapes" in n and "no results" in n for n in notes)
    assert any("compiled_vs_source" in n and "STALE" in n for n in notes)
    assert not any("runner_throughput" in n for n in notes)
    text = report.render(
        loaded, notes, {"cores (nproc)": "2"}, {"python": "3.11"}, "overload table here",
        datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC),
    )  # fmt: skip
    assert "STALE" in text and "overload table here" in text and "2026-01-02" in text
    lone = (
        "| one caller p50 (µs), MLP, default config | 13 | 300 | <= raw batch-1 + 150 = 230 "
        "| FAIL |"
    )
    assert lone in text
    assert text.count("## Overload") == 1
    own = report.render(
        loaded, notes, {}, {}, "## Overload (issue 19)\n\ntable",
        datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC),
    )  # fmt: skip
    assert own.count("## Overload") == 1 and "## Overload (issue 19)\n\ntable" in own


def test_readme_block_is_replaced_and_nothing_else() -> None:
    readme = f"intro\n{report_pages.README_BEGIN}\nold figures\n{report_pages.README_END}\noutro\n"
    new = report_pages.update_readme(readme, ["- ratio 0.95"])
    assert new.startswith("intro\n") and new.endswith(f"{report_pages.README_END}\noutro\n")
    assert "old figures" not in new and "- ratio 0.95" in new
    assert report_pages.update_readme("no markers\n", ["- x"]) == "no markers\n"


def test_a_run_keeps_the_stops_notes_written_by_hand(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    assert report_pages.kept_history(results) == f"\n{report_pages.HISTORY}\n"  # no file yet
    notes = f"{report_pages.HISTORY}\n\n## tenth stop\n\nrun A: 1.38\n"
    results.write_text("# Benchmark results\n\nold run's tables\n\n" + notes)
    kept = report_pages.kept_history(results)
    assert kept == "\n" + notes and "old run's tables" not in kept
    results.write_text("# Benchmark results\n\nno marker yet\n")
    assert report_pages.kept_history(results) == f"\n{report_pages.HISTORY}\n"


def test_http_answer_check_reads_json_and_binary_answers() -> None:
    y = np.arange(10, dtype=np.float32)
    as_json = orjson.dumps(
        {"outputs": [{"name": OUTPUT, "datatype": "FP32", "shape": [1, 10], "data": y.tolist()}]}
    )
    assert np.array_equal(decode_output(as_json, None), y)
    other = np.ones(3, np.float32)
    head = orjson.dumps(
        {
            "outputs": [
                {"name": "other", "parameters": {"binary_data_size": other.nbytes}},
                {"name": OUTPUT, "parameters": {"binary_data_size": y.nbytes}},
            ]
        }
    )
    got = decode_output(head + other.tobytes() + y.tobytes(), str(len(head)))
    assert np.array_equal(got, y)
    swapped = head + y.tobytes() + other.tobytes()  # a server that mixed up its outputs
    assert not np.allclose(decode_output(swapped, str(len(head))), y)


async def test_the_http_benchmark_client_reads_sized_and_chunked_answers() -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello",
        b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",  # the connection goes on
    ]
    got: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            got.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(answer)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        assert await asyncio.wait_for(_exchange(reader, writer, request), 5) == (
            200,
            {"content-length": "5", "x-a": "b"},
            b"hello",
        )
        status, headers, body = await asyncio.wait_for(_exchange(reader, writer, request), 5)
        assert (status, body) == (503, b"abcdefg")
        assert headers == {"transfer-encoding": "chunked"}
        assert (await asyncio.wait_for(_exchange(reader, writer, request), 5))[2] == b"ok"
        writer.close()
    assert got == [request] * 3
