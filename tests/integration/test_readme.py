"""Every Python example in README.md runs as written, and the README's fault plan is served
under load with the default policy without losing or failing a request."""

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
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)

pytestmark = pytest.mark.timeout(150)


def test_the_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_as_written(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"readme_{index}.py"
    script.write_text(BLOCKS[index])
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # The library prints nothing the application did not ask for (logging is unconfigured).
    assert done.stderr == "", done.stderr[-2000:]
    assert "event=" not in done.stdout and "[info" not in done.stdout, done.stdout[-2000:]


async def test_the_readme_fault_plan_loses_nothing_under_load(tmp_path: Path) -> None:
    block = next(b for b in BLOCKS if "fault_plan=" in b)
    scope: dict[str, object] = {}
    exec(block, scope)  # the README's own configuration, unchanged
    config = scope["config"]
    assert isinstance(config, ModelRunnerConfig)
    model = make_mlp(sizes=(WIDTH, 48, 10), seed=5)
    path = compile_to(model, tmp_path, batch_size=4)
    out = await drive(path, Reference(model), config, callers=200, per_caller=8)
    assert out.lost == 0 and out.wrong == 0
    assert out.ok == out.sent, f"errors: {dict(out.errors)}"
    assert out.faults > 0, "the plan fired"
