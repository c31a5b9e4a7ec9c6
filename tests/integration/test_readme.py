"""Every Python example in README.md and in the documentation site (docs/*.md) runs as written,
and the documented fault plan is served under load with the default policy without losing or
failing a request."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from model_runtime.runner import ModelRunnerConfig
from tests.faults.harness import WIDTH, drive
from tests.integration.runner_support import Reference, compile_to
from tests.models import make_mlp

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: A fenced block whose info string names Python in any spelling (```python, ```py, ```python3,
#: with or without attributes after it).
FENCE = re.compile(r"^```(?:python3?|py)\b([^\n]*)\n(.*?)^```", re.S | re.M)

#: Python blocks that only show a call and cannot run alone, by (page, first line), with where
#: that call is tested instead. Every other Python block runs.
FRAGMENTS = {
    ("docs/scaling.md", 'handle = serve.get_app_handle("model-runtime")'): (
        "needs a Ray cluster with the application deployed; tests/integration/test_ray_serve.py "
        "makes that call"
    ),
    ("README.md", "import triton_python_backend_utils as pb_utils"): (
        "a python model's model.py, run by the daemon: tests/integration/test_python_models.py "
        "serves it as written"
    ),
}


def _blocks() -> list[tuple[str, int, str]]:
    found = []
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        for index, match in enumerate(FENCE.finditer(page.read_text())):
            found.append((name, index, match.group(2)))
    return found


BLOCKS = _blocks()
RUNNABLE = [b for b in BLOCKS if (b[0], b[2].splitlines()[0]) not in FRAGMENTS]

pytestmark = pytest.mark.timeout(150)


def test_the_pages_have_python_examples() -> None:
    pages = {page for page, _, _ in RUNNABLE}
    assert "README.md" in pages and len(pages) >= 3, pages
    assert len(RUNNABLE) >= 4


def test_every_listed_fragment_is_still_there() -> None:
    """A fragment that moved or changed must be listed again (or made to run), not forgotten."""
    present = {(page, block.splitlines()[0]) for page, _, block in BLOCKS}
    assert set(FRAGMENTS) <= present, set(FRAGMENTS) - present


@pytest.mark.parametrize(
    ("page", "index", "block"), RUNNABLE, ids=[f"{p}:{i}" for p, i, _ in RUNNABLE]
)
def test_example_runs_as_written(page: str, index: int, block: str, tmp_path: Path) -> None:
    script = tmp_path / f"{Path(page).stem}_{index}.py"
    script.write_text(block)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{page} block {index}: {done.stderr[-2000:]}"
    # The library prints nothing the application did not ask for (logging is unconfigured).
    assert done.stderr == "", done.stderr[-2000:]
    assert "event=" not in done.stdout and "[info" not in done.stdout, done.stdout[-2000:]


async def test_the_documented_fault_plan_loses_nothing_under_load(tmp_path: Path) -> None:
    blocks = [block for _, _, block in RUNNABLE if "fault_plan=" in block]
    assert len(blocks) == 1, "one documented fault plan"
    scope: dict[str, object] = {}
    exec(blocks[0], scope)  # the documentation's own configuration, unchanged
    config = scope["config"]
    assert isinstance(config, ModelRunnerConfig)
    model = make_mlp(sizes=(WIDTH, 48, 10), seed=5)
    path = compile_to(model, tmp_path, batch_size=4)
    out = await drive(path, Reference(model), config, callers=200, per_caller=8)
    assert out.lost == 0 and out.wrong == 0
    assert out.ok == out.sent, f"errors: {dict(out.errors)}"
    assert out.faults > 0, "the plan fired"
