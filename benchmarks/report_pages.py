"""Where a ``make bench`` report goes besides its tables (``benchmarks/report.py``): the bench
block of a page (the headline between two markers) and the notes RESULTS.md keeps from the
stops, written by hand below a marker line."""

from __future__ import annotations

import re
from pathlib import Path

README_BEGIN, README_END = "<!-- bench:begin -->", "<!-- bench:end -->"
#: The line above which RESULTS.md is this run's and below which it is the stops' own notes,
#: written by hand (runs, alternations, what changed): kept as they are by every run.
HISTORY = "<!-- history: written by hand below this line; report.py keeps it -->"


def kept_history(path: Path) -> str:
    """What of ``path`` a run keeps: from the :data:`HISTORY` line on (with it), after a
    blank line; just that line when ``path`` has none, or does not exist."""
    old = path.read_text() if path.exists() else ""
    at = old.find(HISTORY)
    return "\n" + (old[at:] if at >= 0 else HISTORY + "\n")


def update_readme(text: str, lines: list[str], source: str = "benchmarks/RESULTS.md") -> str:
    """``text`` with the block between the bench markers replaced (unchanged if none)."""
    pattern = re.compile(re.escape(README_BEGIN) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        return text
    block = "\n".join(
        [README_BEGIN, f"From the last `make bench` ([{source}]({source})):", "", *lines]
    )
    return pattern.sub(lambda _: block + "\n" + README_END, text, count=1)
