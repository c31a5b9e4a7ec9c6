"""RESULTS.md's part for ``benchmarks/memory.py`` (issue 34): what a model and a replica cost.

``benchmarks/report.py`` calls these with ``memory.json`` (or None when it is missing):
:func:`points` gives the issue's figures (each model past the first, each replica past the
first, in units of the model's weights W, per setup), which report.py judges against the goals
in :data:`GOALS`; :func:`section` the RSS table; :func:`headline` the README's line. Plain data
in and out: this module does not import report.py back.
"""

from __future__ import annotations

from typing import Any

SOURCE = "memory"
#: figure -> (goal in words, the bound): issue 34's "done when".
GOALS = {"per_model_w": ("<= 1.3", 1.3), "per_replica_w": ("<= 0.2", 0.2)}
_NAMES = {
    "per_model_w": "each model past the first",
    "per_replica_w": "each replica past the first",
}


def point_name(setup: str, model: str, figure: str) -> str:
    """The target's name of one figure of one setup."""
    return f"memory, {_NAMES[figure]} (RSS in W), {setup}: {model}"


def points(doc: dict[str, Any] | None) -> list[tuple[str, float | None, str, float]]:
    """(target name, value, goal, bound) for each setup's per-model and per-replica figure
    (the issue's setup first); None where it was not measured."""
    setups = (doc or {}).get("setups") or {"small": {}}
    out = []
    for name, setup in setups.items():
        model = setup.get("model", "MLP 784-512-512-10").split(" (")[0]
        for figure, (goal, bound) in GOALS.items():
            out.append((point_name(name, model, figure), setup.get(figure), goal, bound))
    return out


def section(doc: dict[str, Any] | None) -> list[str]:
    """The memory section: the daemon's RSS at each point, in MB and in W."""
    if not doc:
        return []
    out = [
        "## Memory (issue 34)",
        "",
        f"`benchmarks/memory.py`: the daemon (`MODEL_RUNTIME_DEVICES={doc.get('devices')}`, "
        f"`--batch-size {doc.get('batch')}`) serving models of weights of their own, one fresh "
        f"daemon per point (median RSS of {doc.get('repeat')}), after every model answered one "
        "request. W: one model's weights. The daemon's own accounting (`/metrics`, "
        "`model_runtime_model_memory_bytes`) is beside: `weights` is what the executables "
        "still hold, `sessions` what building the onnxruntime sessions added (the first in a "
        "process also carries onnxruntime's own one-time setup).",
        "",
        "| setup | models | replicas | RSS MB | RSS / W | weights held MB | sessions MB |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, setup in doc.get("setups", {}).items():
        w = setup["weights_bytes"]
        for r in setup["rows"]:
            m = r.get("metrics", {})
            held = m.get("model_runtime_model_memory_bytes:weights")
            sessions = m.get("model_runtime_model_memory_bytes:sessions")
            out.append(
                f"| {name} (W {w / 2**20:.2f} MB) | {r['models']} | {r['replicas']} | "
                f"{r['rss'] / 2**20:.1f} | {r['rss'] / w:.1f} | {_mb(held)} | {_mb(sessions)} |"
            )
    out.append("")
    return out


def headline(doc: dict[str, Any] | None) -> list[str]:
    """The README's line: each model and replica past the first, per setup."""
    if not doc:
        return []
    parts = []
    for setup in doc.get("setups", {}).values():
        model, m, r = setup["model"].split(" (")[0], setup["per_model_w"], setup["per_replica_w"]
        parts.append(f"{model}: each model {_w(m)}, each replica {_w(r)}")
    return [f"- memory past the first (RSS, in units of the weights W): {'; '.join(parts)}"]


def _mb(v: float | None) -> str:
    return "" if v is None else f"{v / 2**20:.1f}"


def _w(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f} W"
