"""The executable cache: one ``<key>.mrx`` per compiled (model, options, target).

No index is kept: a file's name is its key, so any file may be deleted at any time. Files are
written atomically (temp file, then rename) and compiled under an exclusive OS file lock
``<key>.lock``, so processes compiling the same model at once produce exactly one file: the
first compiles, the others wait for the lock and then find it. The kernel releases the lock if
its holder dies; a lock file left behind is harmless.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import onnx
import onnxruntime as ort
import structlog

from model_runtime.compiler.lower import LAYOUT
from model_runtime.compiler.options import CompileOptions
from model_runtime.errors import ConfigurationError, InvalidExecutableError
from model_runtime.executable.container import Executable
from model_runtime.executable.model import FORMAT_VERSION

__all__ = ["EXECUTABLE_SUFFIX", "ExecutableCache", "cache_key"]

EXECUTABLE_SUFFIX = ".mrx"

log = structlog.get_logger(__name__)


def cache_key(model_sha256: str, options: CompileOptions, custom_ops: str = "") -> str:
    """The cache key (hex SHA-256) of a model (by its content hash) compiled with ``options``.

    ``custom_ops`` is the fingerprint of the custom op libraries the model uses (their hashes).
    The onnxruntime and onnx versions are part of it: the optimised graph they produce (fused
    and contrib ops) may not load on another onnxruntime. So is the compiler's program layout
    (:data:`~model_runtime.compiler.lower.LAYOUT`): an executable cached in an older layout
    still loads, but is compiled again rather than served slower.
    """
    doc = {
        "model_sha256": model_sha256,
        "options": options.canonical(),
        "target": asdict(options.device_target),
        "format_version": FORMAT_VERSION,
        "layout": LAYOUT,
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "custom_ops": custom_ops,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class ExecutableCache:
    """A directory of cached executables (created if missing)."""

    def __init__(self, directory: Path) -> None:
        """Use ``directory`` as the cache.

        Raises:
            ConfigurationError: the directory cannot be created or is not a directory.
        """
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"executable cache path {str(directory)!r} cannot be created: {exc.strerror or exc}"
            ) from exc
        self.directory = directory

    def path(self, key: str) -> Path:
        """Where the executable with ``key`` lives (whether or not it exists)."""
        return self.directory / f"{key}{EXECUTABLE_SUFFIX}"

    @contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Hold the exclusive lock for ``key`` (across processes and threads).

        Raises:
            OSError: the lock file cannot be created.
        """
        fd = os.open(self.directory / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("waiting for executable cache lock", key=key)
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def lookup(self, key: str) -> Path | None:
        """The cached executable's path if it exists and is valid; ``None`` otherwise.

        An invalid file (truncated by hand, wrong hash) is deleted so it is compiled again.
        """
        path = self.path(key)
        if not path.exists():
            return None
        try:
            Executable.load(path)
        except InvalidExecutableError as exc:
            log.warning("discarding invalid cached executable", path=str(path), reason=str(exc))
            path.unlink(missing_ok=True)
            return None
        return path
