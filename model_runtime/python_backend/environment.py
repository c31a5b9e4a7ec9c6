"""A python model's own Python environment: Triton's ``EXECUTION_ENV_PATH`` parameter.

The parameter names a directory holding a Python of its own (a venv, or an unpacked conda-pack)
or a ``.tar.gz`` of one (unpacked once into ``CACHE/python-envs``, keyed by the archive's path,
size and modification time). ``$$TRITON_MODEL_DIRECTORY`` in it stands for the model's
directory, as in Triton. :func:`interpreter` gives the Python the model's instances run with.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from model_runtime.errors import ModelLoadError

__all__ = ["ENV_PARAMETER", "default_env_cache", "interpreter"]

ENV_PARAMETER = "EXECUTION_ENV_PATH"
_MODEL_DIR = "$$TRITON_MODEL_DIRECTORY"
_ARCHIVES = (".tar.gz", ".tgz")


def default_env_cache() -> Path:
    """Where archived environments are unpacked unless told otherwise (XDG cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "model-runtime" / "python-envs"


def _unpack(archive: Path, cache: Path) -> Path:
    stat = archive.stat()
    key = hashlib.sha256(f"{archive}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    target = cache / f"{archive.name.split('.')[0]}-{key[:16]}"
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=cache))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            # "tar": no absolute names or paths out of the directory, no setuid bits; a venv's
            # bin/python is a symlink to an absolute path, which it keeps
            tar.extractall(scratch, filter="tar")
        try:
            scratch.rename(target)
        except OSError:
            if not target.is_dir():  # not another load that unpacked it meanwhile
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def interpreter(name: str, value: str, model_dir: Path, cache: Path | None = None) -> str:
    """The Python that runs the instances of model ``name`` whose ``EXECUTION_ENV_PATH`` is
    ``value`` (``$$TRITON_MODEL_DIRECTORY`` replaced by ``model_dir``; a relative path is
    taken from ``model_dir``). Blocking: an archive is unpacked into ``cache`` (default
    :func:`default_env_cache`) the first time.

    Raises:
        ModelLoadError: the path does not exist, an archive does not unpack, or the
            directory holds no ``bin/python3`` / ``bin/python`` (the text names the path).
    """
    where = f"parameter {ENV_PARAMETER} {value!r}"
    path = Path(value.replace(_MODEL_DIR, str(model_dir)))
    if not path.is_absolute():
        path = model_dir / path
    if not path.exists():
        raise ModelLoadError(name, f"{where}: {path} does not exist")
    if path.is_file() and path.name.endswith(_ARCHIVES):
        try:
            path = _unpack(path, cache or default_env_cache())
        except (OSError, tarfile.TarError) as exc:
            raise ModelLoadError(name, f"{where}: {path} does not unpack: {exc}", exc) from exc
    elif not path.is_dir():
        raise ModelLoadError(
            name, f"{where}: {path} is neither a directory nor a .tar.gz of an environment"
        )
    for candidate in ("bin/python3", "bin/python"):
        python = path / candidate
        if python.is_file() and os.access(python, os.X_OK):
            return str(python)
    raise ModelLoadError(name, f"{where}: {path} has no Python (no bin/python3 or bin/python)")
