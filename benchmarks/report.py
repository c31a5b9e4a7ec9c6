"""Write ``benchmarks/RESULTS.md`` from the JSON results of one ``make bench`` run.

Reads ``benchmarks/results/{runner_throughput,compiled_vs_source,http_throughput,
dynamic_shapes,triton_peer,memory,sequences,python_models}.json`` (and includes
``benchmarks/results/overload.md`` when present), adds the machine (cores, CPU model, RAM),
the versions and the date, the tables, and the "done when" targets with a PASS/FAIL column
(``n/a`` where the figure is missing): issue 13's; issue 29's dynamic-shape point
(``dynamic_report.py`` writes its part), issue 31's Triton points (``triton_report.py``),
issue 34's memory figures (``memory_report.py``), issue 43's python models
(``python_models_report.py``); issue 32's sequences
(``sequences_report.py``) have no target. A result file older than ``--since-file``'s
timestamp came from an earlier run (its benchmark failed this time): it is reported, marked
stale. With ``--readme PAGE``, the headline ratios replace the block between the page's
``<!-- bench:begin -->`` and ``<!-- bench:end -->`` markers, so the page quotes this run;
``--results-link`` is where its link goes (``make bench``: docs/benchmarks.md, linking the
site's results.md, which includes RESULTS.md). Everything from the :data:`HISTORY` line on
(each stop's notes, written by hand) is kept as it is.

    .venv/bin/python benchmarks/report.py [--since-file benchmarks/results/.bench-started]
        [--readme docs/benchmarks.md --results-link results.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import (
    dynamic_report,
    http_report,
    memory_report,
    python_models_report,
    sequences_report,
    triton_report,
)
from benchmarks.report_pages import kept_history, update_readme

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
OUT = HERE / "RESULTS.md"
SOURCES = (
    "runner_throughput",
    "compiled_vs_source",
    "http_throughput",
    dynamic_report.SOURCE,
    triton_report.SOURCE,
    triton_report.SPLIT_SOURCE,
    memory_report.SOURCE,
    sequences_report.SOURCE,
    python_models_report.SOURCE,
)


@dataclass(frozen=True)
class Target:
    """One "done when" target (of issue 13 unless ``issue`` says): the measured value against
    the goal."""

    what: str
    value: float | None
    goal: str
    ok: bool | None  # None: not measured in this run
    digits: int = 2
    issue: int = 13

    @property
    def verdict(self) -> str:
        return "n/a" if self.ok is None else ("PASS" if self.ok else "FAIL")


def load(results: Path, since: float | None) -> tuple[dict[str, Any], list[str]]:
    """The results documents by name, and notes on missing or stale ones."""
    docs: dict[str, Any] = {}
    notes: list[str] = []
    for name in SOURCES:
        path = results / f"{name}.json"
        if not path.exists():
            notes.append(f"`{name}`: no results (the benchmark did not run or failed)")
            continue
        try:
            docs[name] = json.loads(path.read_text())
        except ValueError as exc:
            notes.append(f"`{name}`: unreadable results ({exc})")
            continue
        if since is not None and path.stat().st_mtime < since:
            stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC)
            notes.append(
                f"`{name}`: STALE, from an earlier run ({stamp:%Y-%m-%d %H:%M} UTC): "
                "the benchmark failed in this one"
            )
    return docs, notes


def _row(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for r in rows:
        if all(
            (str(r.get(k, "")).startswith(v) if k == "model" else r.get(k) == v)
            for k, v in match.items()
        ):
            return r
    return None


def _target(
    what: str,
    value: float | None,
    goal: str,
    test: Callable[[float], bool],
    digits: int = 2,
    issue: int = 13,
) -> Target:
    return Target(what, value, goal, None if value is None else test(value), digits, issue)


#: The dynamic-shape point's targets (issue 29); the names the README's headline quotes.
DYNAMIC_RATIO, DYNAMIC_RUNS = dynamic_report.RATIO, dynamic_report.RUNS


def dynamic_targets(docs: dict[str, Any]) -> list[Target]:
    """Issue 29's dynamic point (``dynamic_report.points``)."""
    return [
        _target(what, value, goal, test, digits=digits, issue=29)
        for what, value, goal, test, digits in dynamic_report.points(
            docs.get(dynamic_report.SOURCE)
        )
    ]


def targets(docs: dict[str, Any]) -> list[Target]:
    """The "done when" targets, from whatever this run measured: issue 13's, then issue 29's
    dynamic point (:func:`dynamic_targets`)."""
    rt = docs.get("runner_throughput", {})
    rows, lone = rt.get("rows", []), rt.get("lone", [])
    out: list[Target] = []
    for cfg, goal in (("1x1", 0.9), ("1x2", 0.85), ("2x1", 0.85)):
        r = _row(rows, model="mlp", config=cfg, callers=256)
        out.append(
            _target(
                f"runtime / bare batcher, MLP {cfg}, 256 callers",
                r and r["runtime_over_bare"],
                f">= {goal}",
                lambda v, g=goal: v >= g,
            )
        )
    cvs = docs.get("compiled_vs_source", {})
    c = _row(cvs.get("rows", []), layout="weights as constants")
    out.append(
        _target(
            f"compiled / source time, {cvs.get('model')} batch {cvs.get('batch')}",
            c and c["ratio"],
            "<= 1.05",
            lambda v: v <= 1.05,
        )
    )
    solo = _row(lone, model="mlp")
    budget = solo and solo["raw_batch1_p50_us"] + 150
    out.append(
        _target(
            "one caller p50 (µs), MLP, default config",
            solo and solo["runtime_default_p50_us"],
            f"<= raw batch-1 + 150 = {budget:.0f}" if budget else "<= raw batch-1 + 150",
            lambda v: budget is not None and v <= budget,
            digits=0,
        )
    )
    http = docs.get("http_throughput", {}).get("rows", [])
    for peer, clients, goal in (("kserve", 1, 1.5), ("mlserver", 64, 3.0)):
        d = _row(http, server="daemon", mode="json", clients=clients)
        p = _row(http, server=peer, mode="json", clients=clients)
        ratio = d["req_per_s"] / p["req_per_s"] if d and p and p["req_per_s"] else None
        out.append(
            _target(
                f"HTTP JSON daemon / {peer}, {clients} client{'s' * (clients > 1)}",
                ratio,
                f">= {goal}",
                lambda v, g=goal: v >= g,
            )
        )
    one = _row(rows, model="squeezenet", config="1x1", callers=256)
    two = _row(rows, model="squeezenet", config="2x1", callers=256)
    out.append(
        _target(
            "squeezenet, 2 replicas / 1 replica (runtime, 256 callers)",
            one and two and two["runtime_samples_per_s"] / one["runtime_samples_per_s"],
            ">= 1.8",
            lambda v: v >= 1.8,
        )
    )
    return out + dynamic_targets(docs)


def triton_targets(docs: dict[str, Any]) -> list[Target]:
    """Issue 31: ours / Triton (perf_analyzer's inferences/s) >= 1.0 at each point, HTTP and
    gRPC at c = 1, 16, 64 (``triton_report.ratios``)."""
    return [
        _target(what, ratio, ">= 1.0", lambda v: v >= 1.0, issue=31)
        for what, ratio in triton_report.ratios(docs.get(triton_report.SOURCE))
    ]


def memory_targets(docs: dict[str, Any]) -> list[Target]:
    """Issue 34: each model past the first <= 1.3 W, each replica <= 0.2 W, per setup of
    ``memory_report.points``."""
    return [
        _target(what, value, goal, lambda v, bound=bound: v <= bound, issue=34)
        for what, value, goal, bound in memory_report.points(docs.get(memory_report.SOURCE))
    ]


def python_model_targets(docs: dict[str, Any]) -> list[Target]:
    """Issue 43: ours / Triton on the same python models >= 1.0 at c = 16 and 64, HTTP and
    gRPC (``python_models_report.ratios``)."""
    return [
        _target(what, ratio, ">= 1.0", lambda v: v >= 1.0, issue=43)
        for what, ratio in python_models_report.ratios(docs.get(python_models_report.SOURCE))
    ]


def all_targets(docs: dict[str, Any]) -> list[Target]:
    """:func:`targets` (issues 13 and 29), then issue 31's (:func:`triton_targets`), issue
    34's (:func:`memory_targets`) and issue 43's (:func:`python_model_targets`)."""
    return targets(docs) + triton_targets(docs) + memory_targets(docs) + python_model_targets(docs)


def machine() -> dict[str, str]:
    """Cores, CPU model and RAM of this machine (Linux /proc; best effort elsewhere)."""
    cpu = platform.processor() or platform.machine()
    ram = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    except OSError:
        pass
    return {
        "cores (nproc)": str(len(os.sched_getaffinity(0))),
        "CPU": cpu,
        "RAM": ram,
        "OS": f"{platform.system()} {platform.release()}",
    }


def versions(docs: dict[str, Any]) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in ("onnxruntime", "numpy", "aiohttp", "model-runtime"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    servers = docs.get("http_throughput", {}).get("servers", {})
    for peer in ("mlserver", "kserve"):
        out[peer] = servers.get(peer, {}).get("version", "not measured")
    triton = docs.get(triton_report.SOURCE, {}).get("servers", {}).get("triton", {})
    out["tritonserver"] = triton.get("version", "not measured")
    return out


def _fmt(v: float | None, digits: int = 2) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    cells = [["" if c is None else str(c) for c in r] for r in rows]
    return lines + ["| " + " | ".join(r) + " |" for r in cells]


def headline(docs: dict[str, Any], goals: list[Target]) -> list[str]:
    """The few lines the README quotes."""
    by = {t.what: t for t in goals}
    lines = []
    ratios = [
        f"{t.what.split(',')[1].split()[-1]} {_fmt(t.value)}"
        for w, t in by.items()
        if w.startswith("runtime / bare") and t.value is not None
    ]
    if ratios:
        lines.append(f"- runtime / bare batcher (MLP, 256 callers): {', '.join(ratios)}")
    lines += http_report.headline(docs.get(http_report.SOURCE))
    lines += triton_report.headline(docs.get(triton_report.SOURCE))
    lines += memory_report.headline(docs.get(memory_report.SOURCE))
    lines += sequences_report.headline(docs.get(sequences_report.SOURCE))
    lines += dynamic_report.headline(docs.get(dynamic_report.SOURCE))
    lines += python_models_report.headline(docs.get(python_models_report.SOURCE))
    for issue in sorted({t.issue for t in goals}):
        mine = [t for t in goals if t.issue == issue]
        lines.append(
            f"- issue {issue} targets: {sum(t.ok is True for t in mine)} of {len(mine)} PASS "
            f"({sum(t.ok is None for t in mine)} not measured)"
        )
    return lines


def render(
    docs: dict[str, Any],
    notes: list[str],
    host: dict[str, str],
    vers: dict[str, str],
    overload: str | None,
    now: datetime.datetime,
) -> str:
    """RESULTS.md."""
    goals = all_targets(docs)
    out = [
        "# Benchmark results",
        "",
        "Generated by `make bench` (`benchmarks/report.py`); do not edit by hand. "
        f"Date: {now:%Y-%m-%d %H:%M} UTC.",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in host.items()) + ".",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()) + ".",
        "",
    ]
    if notes:
        out += ["**Missing or stale:**", ""] + [f"- {n}" for n in notes] + [""]
    out += ["## Headline", "", *headline(docs, goals), ""]
    out += [
        "## Targets (issue 13; issue 29's dynamic point; issue 31's Triton peer; "
        "issue 34's memory; issue 43's python models)",
        "",
    ]
    out += _table(
        ["target", "issue", "measured", "goal", "result"],
        [[t.what, t.issue, _fmt(t.value, t.digits), t.goal, t.verdict] for t in goals],
    )
    out += [""]

    rt = docs.get("runner_throughput")
    if rt:
        out += [
            "## In process: raw onnxruntime, the bare batcher, the runtime",
            "",
            f"`benchmarks/runner_throughput.py`: {rt.get('seconds')} s per point, loop "
            f"{rt.get('loop')}, bare batcher flush {rt.get('bare_flush_ms')} ms, runtime timeout "
            f"{rt.get('runtime_timeout_ms')} ms; C single-sample callers; raw = full batches "
            "back to back (the compute ceiling). Config REPLICASxTHREADS. "
            + (
                f"Each MLP point: {rt['mlp_pairs']} alternating bare/runtime pairs, shown by the "
                "pair with the median rt/bare (all pairs' ratios in the JSON). "
                if rt.get("mlp_pairs")
                else ""
            ),
            "",
        ]
        out += _table(
            ["model", "cfg", "C", "raw/s", "bare/s", "runtime/s", "rt/bare", "rt/raw",
             "rt p50 µs", "rt p99 µs", "bare p50 µs", "bare p99 µs"],
            [
                [r.get("model"), r.get("config"), r.get("callers"),
                 _fmt(r.get("raw_samples_per_s"), 0), _fmt(r.get("bare_samples_per_s"), 0),
                 _fmt(r.get("runtime_samples_per_s"), 0), _fmt(r.get("runtime_over_bare")),
                 _fmt(r.get("runtime_over_raw")), _fmt(r.get("runtime_p50_us"), 0),
                 _fmt(r.get("runtime_p99_us"), 0), _fmt(r.get("bare_p50_us"), 0),
                 _fmt(r.get("bare_p99_us"), 0)]
                for r in rt.get("rows", [])
            ],
        )  # fmt: skip
        if rt.get("lone"):
            out += [
                "",
                "One caller, the runtime's DEFAULT config (cpu 1x1) vs plain onnxruntime on the "
                "source model at batch 1:",
                "",
            ]
            out += _table(
                ["model", "raw batch-1 p50 µs", "runtime p50 µs", "runtime p99 µs",
                 "runtime - raw µs", "requests", "default timeout ms"],
                [
                    [r.get("model"), _fmt(r.get("raw_batch1_p50_us"), 0),
                     _fmt(r.get("runtime_default_p50_us"), 0),
                     _fmt(r.get("runtime_default_p99_us"), 0),
                     _fmt(_minus(r.get("runtime_default_p50_us"), r.get("raw_batch1_p50_us")), 0),
                     r.get("runtime_default_requests"),
                     _fmt(r.get("runtime_default_timeout_ms"), 3)]
                    for r in rt["lone"]
                ],
            )  # fmt: skip
        out += [""]

    cvs = docs.get("compiled_vs_source")
    if cvs:
        out += [
            "## Compiled program vs its source model",
            "",
            f"`benchmarks/compiled_vs_source.py`: {cvs.get('model')} batch {cvs.get('batch')}, "
            f"{cvs.get('threads')} thread(s), {cvs.get('rounds')} rounds x {cvs.get('runs')} "
            "interleaved runs, median ratio.",
            "",
        ]
        out += _table(
            ["compiled layout", "compiled ms", "source ms", "compiled/source"],
            [
                [
                    r.get("layout"),
                    _fmt(r.get("compiled_ms")),
                    _fmt(r.get("source_ms")),
                    _fmt(r.get("ratio"), 3),
                ]
                for r in cvs.get("rows", [])
            ],
        )
        out += [""]

    out += dynamic_report.section(docs.get(dynamic_report.SOURCE))

    out += http_report.section(docs.get(http_report.SOURCE))

    out += triton_report.section(docs.get(triton_report.SOURCE))
    out += triton_report.split_section(docs.get(triton_report.SPLIT_SOURCE))
    out += memory_report.section(docs.get(memory_report.SOURCE))
    out += sequences_report.section(docs.get(sequences_report.SOURCE))
    out += python_models_report.section(docs.get(python_models_report.SOURCE))

    if overload:
        text = overload.strip()  # overload.md brings its own heading
        out += ([] if text.startswith("## ") else ["## Overload", ""]) + [text, ""]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--since-file", type=Path, help="a file holding the run's start (epoch s)")
    parser.add_argument("--readme", type=Path, help="update this page's bench block")
    parser.add_argument(
        "--results-link", default="benchmarks/RESULTS.md", help="the block's link to the results"
    )
    args = parser.parse_args()
    since = None
    if args.since_file and args.since_file.exists():
        since = float(args.since_file.read_text().strip() or 0)
    docs, notes = load(args.results, since)
    overload_md = args.results / "overload.md"
    overload = overload_md.read_text() if overload_md.exists() else None
    now = datetime.datetime.now(datetime.UTC)
    text = render(docs, notes, machine(), versions(docs), overload, now)
    args.out.write_text(text + kept_history(args.out))
    goals = all_targets(docs)
    width = max(len(t.what) for t in goals)
    print(f"{'target':<{width}}  {'issue':>5}  {'measured':>9}  {'goal':<30} result")
    for t in goals:
        print(
            f"{t.what:<{width}}  {t.issue:>5}  {_fmt(t.value, t.digits):>9}  {t.goal:<30} "
            f"{t.verdict}"
        )
    for n in notes:
        print(f"note: {n}")
    print(f"wrote {args.out}")
    if args.readme:
        old = args.readme.read_text()
        new = update_readme(old, headline(docs, goals), args.results_link)
        if new != old:
            args.readme.write_text(new)
            print(f"updated the bench block of {args.readme}")


if __name__ == "__main__":
    main()
