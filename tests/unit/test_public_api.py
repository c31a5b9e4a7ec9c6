"""The public API is exactly what ``model_runtime.__all__`` lists, and every name resolves."""

from __future__ import annotations

import subprocess
import sys

import model_runtime


def test_every_public_name_resolves() -> None:
    missing = [n for n in model_runtime.__all__ if getattr(model_runtime, n, None) is None]
    assert not missing
    assert len(set(model_runtime.__all__)) == len(model_runtime.__all__)


def test_public_errors_are_model_runtime_errors() -> None:
    for name in model_runtime.__all__:
        value = getattr(model_runtime, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, model_runtime.ModelRuntimeError), name


def test_importing_the_package_does_not_import_the_actors() -> None:
    code = "import sys, model_runtime; print(any(m.startswith('actors') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
