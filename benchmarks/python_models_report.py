"""RESULTS.md's part for ``benchmarks/python_models.py`` (issue 43): the same python models
(``model.py`` + ``config.pbtxt``) on the daemon and on NVIDIA's real Triton, perf_analyzer.

``benchmarks/report.py`` calls these with ``python_models.json`` (or None when it is missing):
:func:`ratios` gives the issue's points (ours / Triton at c = 16 and 64 over HTTP and gRPC, per
model; None where not measured), judged against ">= 1.0"; :func:`section` the table;
:func:`headline` the README's line. Plain data in and out: this module does not import
report.py back.
"""

from __future__ import annotations

from typing import Any

SOURCE = "python_models"
#: The points issue 43 judges.
MODELS, PROTOCOLS, CLIENTS = ("add_sub", "ort_batch"), ("http", "grpc"), (16, 64)


def point_name(model: str, protocol: str, clients: int) -> str:
    """The target's name of one point."""
    return f"ours / Triton, python model {model}, perf_analyzer {protocol.upper()} c={clients}"


def ratios(doc: dict[str, Any] | None) -> list[tuple[str, float | None]]:
    """(target name, ours / Triton) per model, protocol and c = 16, 64; None: not measured."""
    rows = {(r["model"], r["protocol"], r["clients"]): r for r in (doc or {}).get("rows", [])}
    return [
        (point_name(m, p, c), (rows.get((m, p, c)) or {}).get("ratio"))
        for m in MODELS
        for p in PROTOCOLS
        for c in CLIENTS
    ]


def _f(v: float | None, digits: int = 0) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def _cpu(row: dict[str, Any], name: str) -> str:
    front, rest = row.get(f"{name}_front_cpu_us"), row.get(f"{name}_instance_cpu_us")
    return "" if front is None or rest is None else f"{front} + {rest}"


def headline(doc: dict[str, Any] | None) -> list[str]:
    """The README's line: ours / Triton per model and protocol."""
    parts = []
    for model in MODELS:
        for protocol in PROTOCOLS:
            at = [
                r
                for r in (doc or {}).get("rows", [])
                if (r["model"], r["protocol"]) == (model, protocol) and r.get("ratio")
            ]
            if at:
                clients = "/".join(str(r["clients"]) for r in at)
                values = " / ".join(f"{r['ratio']:.2f}x" for r in at)
                parts.append(f"{model} {protocol} at c={clients} {values}")
    if not parts:
        return []
    return [f"- ours / Triton, the same python models (req/s): {'; '.join(parts)}"]


def section(doc: dict[str, Any] | None) -> list[str]:
    """The python models section of RESULTS.md (nothing when there are no results)."""
    if not doc:
        return []
    pa = doc.get("perf_analyzer", {})
    out = [
        "## Python models: the same model.py on the daemon and on Triton (issue 43)",
        "",
        "`benchmarks/python_models.py`: one model repository served by both servers, started "
        "one after the other on loopback; at each point the runs alternate ours, Triton "
        f"(pairs: {doc.get('pairs')}); the figure is each server's median, the ratio "
        f"ours/Triton of the medians. perf_analyzer {pa.get('version')}, same flags for both: "
        f"{pa.get('flags')}. Elapsed {doc.get('elapsed_s')} s. Command: `{doc.get('command')}`.",
        "",
    ]
    for name, what in doc.get("models", {}).items():
        out.append(f"- {name}: {what}")
    for name, s in doc.get("servers", {}).items():
        out.append(f"- {name} {s.get('version')}: {s.get('setup')}")
    for s in doc.get("skipped", []):
        out.append(f"- not measured: {s['what']}: {str(s['why']).splitlines()[0]}")
    busy = doc.get("host_busy_before", []) + doc.get("host_busy_after", [])
    out.append(
        "- other busy processes on the host, before/after: "
        + ("; ".join(f"{b['cmd'][:60]} ({b['cpu_pct']}%)" for b in busy) or "none")
    )
    out.append(
        "- CPU µs/inf: CPU per inference, median over the runs, as server + instances: the "
        "server process (ours: the daemon, its front ends and batcher; Triton: tritonserver) "
        "and its instance processes (ours: the instance processes; Triton: the python "
        "backend stubs). The load generator shares the same 2 cores"
    )
    for note in doc.get("notes", []):
        out.append(f"- {note}")
    out += [
        "",
        "| model | protocol | C | ours /s | Triton /s | ours/Triton | pair ratios | ours p50 µs "
        "| Triton p50 µs | ours CPU µs/inf | Triton CPU µs/inf | failed runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc.get("rows", []):
        cells = [
            r["model"], r["protocol"], r["clients"], _f(r.get("ours_per_s")),
            _f(r.get("triton_per_s")), _f(r.get("ratio"), 2),
            " ".join(f"{x:.2f}" for x in r.get("pair_ratios", [])), _f(r.get("ours_p50_us")),
            _f(r.get("triton_p50_us")), _cpu(r, "ours"), _cpu(r, "triton"),
            "; ".join(r.get("errors", []))[:160],
        ]  # fmt: skip
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return [*out, ""]
