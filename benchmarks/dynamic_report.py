"""RESULTS.md's part for ``benchmarks/dynamic_shapes.py`` (issue 29): the text classifier (5
sequence lengths, 64 callers) through the runtime against raw onnxruntime running each request
alone, and batching's ceiling on this host (onnxruntime running the same requests in batches).
``benchmarks/report.py`` calls :func:`points`, :func:`section` and :func:`headline` with
``dynamic_shapes.json`` (or None when it is missing). Plain data in and out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SOURCE = "dynamic_shapes"

#: The targets' names (the README's headline and the tests quote them).
RATIO = "dynamic text classifier, runtime / raw onnxruntime per request, 64 callers"
RUNS = "dynamic text classifier, device runs per request, 64 callers"


def _issue_row(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The issue's row: the classifier (the first model) at 64 callers."""
    for r in (doc or {}).get("rows", []):
        if r.get("callers") == 64 and str(r.get("model", "")).startswith("text classifier"):
            return r
    return None


def points(
    doc: dict[str, Any] | None,
) -> list[tuple[str, float | None, str, Callable[[float], bool], int]]:
    """(target name, value, goal, test, digits): the classifier served >= 2x faster than raw
    onnxruntime running each request alone (a sampled answer that differs from onnxruntime's
    fails it), at <= 0.6 device runs per request; None where not measured."""
    r = _issue_row(doc)
    wrong: int = r.get("answers_wrong", 0) if r else 0
    goal = ">= 2.0, answers equal" if not wrong else f">= 2.0, answers equal ({wrong} wrong)"
    return [
        (RATIO, r["runtime_over_raw"] if r else None, goal, lambda v: v >= 2.0 and not wrong, 2),
        (RUNS, r["runs_per_request"] if r else None, "<= 0.6", lambda v: v <= 0.6, 3),
    ]


def _ceilings(doc: dict[str, Any]) -> str:
    """Batching's ceiling (batched/raw) per model, for the headline."""
    rows = [r for r in doc.get("rows", []) if "batched_over_raw" in r]
    if not rows:
        return ""
    parts = [
        f"{r['model'].split(' (')[0].split(' ids')[0]} {r['batched_over_raw']:.2f}x" for r in rows
    ]
    return "; batching's ceiling here (onnxruntime batched / raw): " + ", ".join(parts)


def headline(doc: dict[str, Any] | None) -> list[str]:
    """The README's line."""
    r = _issue_row(doc)
    if not doc or not r:
        return []
    return [
        f"- dynamic text classifier (5 seq lengths, 64 callers): runtime / raw onnxruntime "
        f"per request {r['runtime_over_raw']:.2f}x ({r['runtime_req_per_s']:.0f} vs "
        f"{r['raw_req_per_s']:.0f} req/s), {r['runs_per_request']:.3f} device runs "
        f"per request" + _ceilings(doc)
    ]


def _fmt(v: float | None, digits: int = 2) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def section(doc: dict[str, Any] | None) -> list[str]:
    """The dynamic-shapes section: one row per model, the median pair's figures."""
    if not doc:
        return []
    out = [
        "## Dynamic shapes: the text classifier against raw onnxruntime per request",
        "",
        f"`benchmarks/dynamic_shapes.py`: ids [batch, seq], {doc.get('requests')} "
        "single-sample requests of seq lengths 1/4/16/32/64; raw = one onnxruntime "
        "session (1 thread) running each request alone, back to back; runtime = "
        f"`{doc.get('runtime_config')}` on {doc.get('device')}, C concurrent callers. "
        f"{doc.get('seconds')} s per point, {doc.get('pairs')} alternating raw/runtime "
        "pairs, shown by the pair with the median ratio. Runs/req: device runs over "
        "requests sent in the window. Batched: the same session running the requests "
        "grouped by length, as many rows per run as the runtime's runs held, back to "
        "back (batching's ceiling here, no batcher's cost); bt/raw is the most any batcher "
        "could reach of the 2.0 target on this host. A sample of answers checked against "
        "onnxruntime on each request alone.",
        "",
    ]
    header = [
        "model", "C", "raw req/s", "runtime req/s", "rt/raw", "pair ratios", "runs/req",
        "batched req/s", "bt/raw", "rt/bt", "rt p50 µs", "rt p99 µs", "raw p50 µs",
        "answers checked", "wrong",
    ]  # fmt: skip
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in doc.get("rows", []):
        cells = [
            r.get("model"), r.get("callers"), _fmt(r.get("raw_req_per_s"), 0),
            _fmt(r.get("runtime_req_per_s"), 0), _fmt(r.get("runtime_over_raw")),
            " ".join(f"{x:.2f}" for x in r.get("pair_ratios", [])),
            _fmt(r.get("runs_per_request"), 3), _fmt(r.get("batched_req_per_s"), 0),
            _fmt(r.get("batched_over_raw")), _fmt(r.get("runtime_over_batched")),
            _fmt(r.get("runtime_p50_us"), 0), _fmt(r.get("runtime_p99_us"), 0),
            _fmt(r.get("raw_p50_us"), 0), r.get("answers_checked"), r.get("answers_wrong"),
        ]  # fmt: skip
        out.append("| " + " | ".join("" if c is None else str(c) for c in cells) + " |")
    out.append("")
    return out
