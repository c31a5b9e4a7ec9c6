"""RESULTS.md's part for ``benchmarks/triton_peer.py`` (issue 31): the daemon against NVIDIA's
real Triton server, both driven by perf_analyzer (and by our load generator over HTTP).

``benchmarks/report.py`` calls these with ``triton_peer.json`` (or None when it is missing):
:func:`ratios` gives the issue's points (ours / Triton throughput under perf_analyzer, each
protocol and concurrency; None where not measured), which report.py judges against ">= 1.0";
:func:`section` the table and how Triton was set up; :func:`headline` the README's line. Plain
data in and out: this module does not import report.py back.
"""

from __future__ import annotations

from typing import Any

SOURCE = "triton_peer"
#: The points issue 31 judges, when the results do not say which were run.
PROTOCOLS, CLIENTS = ("http", "grpc"), (1, 16, 64)


def point_name(protocol: str, clients: int) -> str:
    """The target's name of one perf_analyzer point."""
    return f"ours / Triton, perf_analyzer {protocol.upper()} c={clients} (inferences/s)"


def _rows(doc: dict[str, Any] | None, tool: str) -> list[dict[str, Any]]:
    return [r for r in (doc or {}).get("rows", []) if r.get("tool") == tool]


def ratios(doc: dict[str, Any] | None) -> list[tuple[str, float | None]]:
    """(target name, ours / Triton) for each perf_analyzer point of issue 31 (HTTP and gRPC at
    c = 1, 16, 64, and any other point the results hold); None where it was not measured."""
    rows = {(r["protocol"], r["clients"]): r for r in _rows(doc, "perf_analyzer")}
    points = [(p, c) for p in PROTOCOLS for c in CLIENTS]
    points += sorted(k for k in rows if k not in points)
    return [(point_name(p, c), (rows.get((p, c)) or {}).get("ratio")) for p, c in points]


def _f(v: float | None, digits: int = 0) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def headline(doc: dict[str, Any] | None) -> list[str]:
    """The README's line: ours / Triton at each point, per load generator and protocol."""
    parts = []
    for tool in ("perf_analyzer", "loadgen"):
        for protocol in PROTOCOLS:
            at = [r for r in _rows(doc, tool) if r["protocol"] == protocol and r.get("ratio")]
            if at:
                clients = "/".join(str(r["clients"]) for r in at)
                values = " / ".join(f"{r['ratio']:.2f}x" for r in at)
                parts.append(f"{tool} {protocol} at c={clients} {values}")
    if not parts:
        return []
    triton = (doc or {}).get("servers", {}).get("triton", {}).get("version", "?")
    return [f"- ours / Triton {triton} python backend (req/s): {'; '.join(parts)}"]


def section(doc: dict[str, Any] | None) -> list[str]:
    """The Triton section of RESULTS.md (nothing when there are no results)."""
    if not doc:
        return []
    pa, lg = doc.get("perf_analyzer", {}), doc.get("loadgen", {})
    out = [
        "## Triton: the daemon vs NVIDIA's real Triton server (issue 31)",
        "",
        f"`benchmarks/triton_peer.py`: {doc.get('model')}; both servers up on loopback, started "
        "one after the other; at each point the runs alternate ours, Triton "
        f"(pairs: {doc.get('pairs')}), the figure is each server's median, the ratio "
        "ours/Triton of the medians (each pair's ratio beside it). perf_analyzer "
        f"{pa.get('version')}, same flags for both: {pa.get('flags')}. Our load generator "
        f"(`benchmarks/loadgen.py`): {lg.get('protocol')}, closed loop, {lg.get('processes')} "
        f"process, {lg.get('seconds')} s per run, every answer checked. Elapsed "
        f"{doc.get('elapsed_s')} s.",
        "",
    ]
    for name, s in doc.get("servers", {}).items():
        out.append(f"- {name} {s.get('version')}: {s.get('setup')}")
    triton = doc.get("servers", {}).get("triton")
    if triton:
        stub = triton.get("stub") or {}
        lay = triton.get("layout") or {}
        out.append(
            "- Triton set up by `make triton-peer` (`benchmarks/peers/triton_install.sh`): the "
            "nvidia-pytriton wheel's `tritonserver`, its `backends/` and the python backend stub "
            f"for Python {lay.get('python')} copied into `.venv-peers/triton/tritonserver/`; "
            "started with the venv's `bin` first on `PATH` and `LD_LIBRARY_PATH="
            + ":".join(lay.get("ld_library_path", []))
            + "` (the interpreter's LIBDIR for the stub's libpython, the wheel's bundled "
            "libraries); glibc 2.34 suffices, no sysroot. The stub ran Python "
            f"{stub.get('python')} from `{stub.get('prefix')}`, onnxruntime "
            f"{stub.get('onnxruntime')}, numpy {stub.get('numpy')}, "
            f"{stub.get('intra_op_threads')} intra-op thread."
        )
        eff = triton.get("effective_config") or {}
        if eff:
            batching = ", ".join(
                f"{k} {v}"
                for k, v in (eff.get("dynamic_batching") or {}).items()
                if k in ("preferred_batch_size", "max_queue_delay_microseconds")
            )
            groups = "; ".join(
                f"{g.get('count')} x {g.get('kind')}" for g in eff.get("instance_group", [])
            )
            out.append(
                f"- Triton's model config as it served it: max_batch_size "
                f"{eff.get('max_batch_size')}, dynamic batching ({batching}), instances "
                f"{groups}; command: `{' '.join(triton.get('command', []))}`"
            )
    for s in doc.get("skipped", []):
        out.append(f"- not measured: {s['what']}: {str(s['why']).splitlines()[0]}")
    busy = doc.get("host_busy_before", []) + doc.get("host_busy_after", [])
    out.append(
        "- other busy processes on the host, before/after: "
        + ("; ".join(f"{b['cmd'][:60]} ({b['cpu_pct']}%)" for b in busy) or "none")
    )
    out.append(
        "- cores: the CPU seconds a server used over the run's wall time (median over its "
        "runs); the load generator shares the same 2 cores"
    )
    idle = [r["idle_cpu_s"] for r in doc.get("runs", []) if r.get("idle_cpu_s") is not None]
    if idle:
        out.append(f"- CPU of the idle server during the other's runs: at most {max(idle)} s/run")
    foreign = [r["foreign_cpu_s"] for r in doc.get("runs", []) if "foreign_cpu_s" in r]
    if foreign:
        out.append(
            "- CPU of everything else on the machine during the runs (neither server nor the "
            f"load generator): median {sorted(foreign)[len(foreign) // 2]} s/run, at most "
            f"{max(foreign)} s/run"
        )
    out += [""]
    table = []
    for r in _rows(doc, "perf_analyzer") + _rows(doc, "loadgen"):
        table.append(
            [r["tool"], r["protocol"], r["clients"], _f(r.get("ours_per_s")),
             _f(r.get("triton_per_s")), _f(r.get("ratio"), 2),
             " ".join(f"{x:.2f}" for x in r.get("pair_ratios", [])),
             _f(r.get("ours_p50_us")), _f(r.get("triton_p50_us")), _f(r.get("ours_p99_us")),
             _f(r.get("triton_p99_us")), _f(r.get("ours_cores"), 2),
             _f(r.get("triton_cores"), 2), "; ".join(r.get("errors", []))[:120]]
        )  # fmt: skip
    header = ["load generator", "protocol", "C", "ours /s", "Triton /s", "ours/Triton",
              "pair ratios", "ours p50 µs", "Triton p50 µs", "ours p99 µs", "Triton p99 µs",
              "ours cores", "Triton cores", "failed runs"]  # fmt: skip
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in table]
    return [*out, ""]


#: ``benchmarks/front_end_split.py``'s results (issue 31: would a second process pay here?).
SPLIT_SOURCE = "front_end_split"


def split_section(doc: dict[str, Any] | None) -> list[str]:
    """The front-end split: one daemon, two sharing a port, Triton, alternated."""
    if not doc:
        return []
    out = [
        "## One daemon, two sharing a port, and Triton (issue 31)",
        "",
        "`benchmarks/front_end_split.py`: perf_analyzer against one daemon (as above), two "
        "daemons bound to the same ports with `--reuse-port` (each with a cpu:1x1 device and "
        "the model of its own: the ceiling of any split of the front end over two processes, "
        "with nothing crossing between them) and Triton, alternated, "
        f"{doc.get('cores')} cores. Medians of the runs (inferences/s).",
        "",
        "| protocol | C | one | two | Triton | two/one | two/Triton | one/Triton |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc.get("rows", []):
        out.append(
            f"| {r['protocol']} | {r['clients']} | {_f(r.get('one'))} | {_f(r.get('two'))} | "
            f"{_f(r.get('triton'))} | {_f(r.get('two_over_one'), 2)} | "
            f"{_f(r.get('two_over_triton'), 2)} | {_f(r.get('one_over_triton'), 2)} |"
        )
    out.append("")
    return out
