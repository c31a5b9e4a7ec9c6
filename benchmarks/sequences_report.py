"""RESULTS.md's part for ``benchmarks/sequences.py`` (issue 32): steps per second of 200
sequences through the sequence batcher against the same model run stateless, state passed by
the client. ``benchmarks/report.py`` calls :func:`section` and :func:`headline` with
``sequences.json`` (or None when it is missing). Plain data in and out."""

from __future__ import annotations

from typing import Any

SOURCE = "sequences"


def section(doc: dict[str, Any] | None) -> list[str]:
    """The sequences section: each alternating pair, and the median ratio."""
    if not doc:
        return []
    out = [
        "## Sequences (issue 32)",
        "",
        f"`benchmarks/sequences.py`: {doc['sequences']} sequences of {doc['steps']} steps at "
        f"once, each step after the previous one, {doc['model']}. `sequences`: through the "
        "sequence batcher (it keeps the state, fills START and READY); `stateless`: the same "
        "model called with all its inputs, each client keeping its own state. Every answer "
        f"checked ({doc['wrong']} wrong). Median of the pairs: sequences / stateless "
        f"**{doc['median_ratio']:.2f}**.",
        "",
        "| pair | sequences steps/s | stateless steps/s | ratio |",
        "| --- | --- | --- | --- |",
    ]
    for r in doc["pairs"]:
        out.append(
            f"| {r['pair']} | {r['sequences_steps_per_s']:.0f} | "
            f"{r['stateless_steps_per_s']:.0f} | {r['ratio']:.2f} |"
        )
    out.append("")
    return out


def headline(doc: dict[str, Any] | None) -> list[str]:
    """The README's line."""
    if not doc:
        return []
    return [
        f"- sequences ({doc['sequences']} at once): {doc['sequences_steps_per_s']:.0f} steps/s, "
        f"{doc['median_ratio']:.2f}x the same model stateless with the client's state"
    ]
