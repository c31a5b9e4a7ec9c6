"""``auto_complete_config``: a python model completes its own config, as Triton lets it."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from model_runtime.python_backend.instance import InstanceProcess, InstanceSpec

__all__ = ["auto_complete_config"]


async def auto_complete_config(
    model_dir: Path,
    version: int,
    config: Mapping[str, Any],
    *,
    python: str = sys.executable,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """The config after the model's ``auto_complete_config`` (unchanged if it has none), run
    in a short-lived instance process that ends after it (Triton: nothing it made survives).

    Raises:
        ModelLoadError: ``model.py`` does not import, or ``auto_complete_config`` raised or
            returned something other than the ``ModelConfig`` (its text says what).
    """
    base: dict[str, Any] = {"max_batch_size": 0, "input": [], "output": []}
    base |= dict(config)
    base.setdefault("name", Path(model_dir).name)
    filename = str(base.get("default_model_filename") or "model.py")
    spec = InstanceSpec(
        str(base["name"]), version, Path(model_dir) / str(version) / filename, base,
        python=python, ring_bytes=4096,
    )  # fmt: skip
    process = InstanceProcess(spec)
    return await process.start(initialize=False, auto_complete=True, timeout=timeout)
