"""The names of the daemon's model repository: which models there are, and where their files are.

Models come from explicit paths (``NAME=PATH`` or ``PATH``; the name is then the file's stem)
and from repository directories of ``NAME.mrx`` / ``NAME.onnx`` files (with an optional
``NAME.toml`` of per-model settings) and of Triton model directories (``NAME/config.pbtxt``,
``NAME/<version>/model.onnx``; see :mod:`model_runtime.server.triton.layout`). Each version a
Triton model's version policy selects is served by its own runner: the :class:`ModelEntry` of
a model is its highest version, the others are in its ``versions``. Names from clients are
checked against a strict pattern (Triton's rules and words) and resolved inside the
directories: ``../`` and symlinks that lead out are refused, a name in two directories too.

:class:`ModelCatalogue` registers, finds and indexes the entries and says whether the server
is ready; it starts nothing (:class:`~model_runtime.server.repository.repository.ModelRepository`
loads, reloads and unloads them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from model_runtime.errors import ConfigurationError, InputValidationError, UnknownModelError
from model_runtime.server import answers
from model_runtime.server.repository.ensembles import composing_not_ready
from model_runtime.server.repository.entries import (
    NAME_PATTERN,
    SUFFIXES,
    ModelEntry,
    ModelState,
    resolve_in,
)
from model_runtime.server.triton.layout import is_model_dir

__all__ = ["ModelCatalogue"]


class ModelCatalogue:
    """The repository's models by name (see the module docstring). ``directory`` and
    ``more_directories``: the repository directories (Triton's repeated
    ``--model-repository``), searched in order; ``strict_readiness`` and ``starting`` decide
    :meth:`not_ready_reason`."""

    def __init__(
        self,
        *,
        directory: Path | None = None,
        more_directories: Sequence[Path] = (),
        strict_readiness: bool = True,
    ) -> None:
        self.directory = directory.resolve() if directory is not None else None
        #: Every repository directory (Triton's repeated ``--model-repository``), first first.
        self.directories = [d.resolve() for d in (directory, *more_directories) if d is not None]
        self.strict_readiness = strict_readiness
        #: True while the daemon loads its models at start: the server is not ready yet.
        self.starting = False
        self._models: dict[str, ModelEntry] = {}

    def add(self, name: str, source: Path, *, in_directory: bool = False) -> ModelEntry:
        """Register a model by name (not loaded).

        Raises:
            InputValidationError: the name is already taken by another file.
        """
        entry = self._models.get(name)
        if entry is not None and entry.source != source:
            raise InputValidationError(f"two models are named {name!r}: {entry.source}, {source}")
        if entry is None:
            entry = self._models[name] = ModelEntry(name, source, in_directory=in_directory)
        return entry

    def scan(self) -> list[str]:
        """Register every model file of the repository directory; return their names.

        Raises:
            OSError: the directory cannot be listed.
        """
        names = set()
        paths = [path for directory in self.directories for path in directory.iterdir()]
        for path in paths:
            name = path.name if path.is_dir() else path.stem
            if (path.suffix in SUFFIXES or path.is_dir()) and NAME_PATTERN.fullmatch(name):
                found = self._resolve(name)
                if found is not None and name not in self._models:
                    self.add(name, found, in_directory=True)
                if name in self._models and found is not None:
                    names.add(name)
        return sorted(names)

    def _resolve(self, name: str) -> Path | None:
        """The file of ``name`` inside the repository directories (``.mrx`` first), else its
        Triton model directory, or None.

        Raises:
            ConfigurationError: ``name`` is in two repository directories (Triton refuses it).
        """
        found = [f for d in self.directories if (f := resolve_in(d, name)) is not None]
        if len(found) > 1:
            raise ConfigurationError(
                f"model {name!r} is in more than one model repository: {[str(f) for f in found]}"
            )
        return found[0] if found else None

    def _source_now(self, entry: ModelEntry) -> Path | None:
        """The file ``entry`` would load now (a directory model is resolved again), or None."""
        if entry.in_directory and self.directories:
            return self._resolve(entry.name)
        source = entry.source
        return source if source.is_file() or is_model_dir(source) else None

    def get(self, name: str, version: str | None = None) -> ModelEntry:
        """The model called ``name`` (its highest version served), or its ``version``.

        Raises:
            UnknownModelError: no such model, or that version of it is not served (Triton's
                wording, as a client is answered).
            ProtocolError: ``version`` is not a version number (Triton's words).
        """
        entry = self._models.get(name)
        if entry is None:
            raise UnknownModelError(name)
        if not version:
            return entry
        found = entry.version_entry(answers.model_version(version))
        if found is None:
            raise UnknownModelError(name, version)
        return found

    def _models_by_name(self) -> list[ModelEntry]:
        return [self._models[n] for n in sorted(self._models)]

    def entries(self) -> list[ModelEntry]:
        """Every known model, by name, and each version served (the others after the
        model's own entry, ascending)."""
        out = []
        for entry in self._models_by_name():
            out.append(entry)
            out += [entry.versions[v] for v in sorted(entry.versions, key=int)]
        return out

    def index(self) -> list[dict[str, str]]:
        """The repository index (protocol repository extension): every model, its state and
        the reason (why it is unavailable, or why its last reload failed).

        Raises:
            OSError: the repository directory cannot be listed.
        """
        self.scan()
        return [
            {"name": e.name, "version": e.version, "state": e.state.value, "reason": _reason(e)}
            for e in self.entries()
        ]

    def not_ready(self, model: str, version: int) -> str | None:
        """Why version ``version`` (-1: the latest served) of ``model`` cannot take a request
        now, or None (what an ensemble asks of its composing models)."""
        return composing_not_ready(self._models.get(model), model, version)

    def not_ready_reason(self) -> str | None:
        """Why the server is not ready (None: it is), Triton's way: while the models of the
        start load, not ready; then, with ``strict_readiness``, ready when every model that
        should be loaded is ready; without it, ready (the server can serve)."""
        if self.starting:
            return "the server is loading its models"
        if not self.strict_readiness:
            return None
        bad = [e.name for e in self._models_by_name() if e.wanted and not e.is_ready]
        if bad:
            return f"model(s) not ready: {bad} (see POST /v2/repository/index)"
        return None

    def _lookup_for_load(self, name: str) -> ModelEntry:
        # Triton's rules for a name to load (ValidateModelName), in its words; any other name
        # is looked up, and one no file of the repository can have is not found.
        if not name.strip():
            raise answers.model_name_empty()
        if name.strip() == ".." or "/" in name:
            raise answers.model_name_traversal(name)
        entry = self._models.get(name)
        if entry is not None:
            return entry
        found = None
        if self.directories and NAME_PATTERN.fullmatch(name) and name not in (".", ".."):
            found = self._resolve(name)
        if found is None:
            raise UnknownModelError(name)
        return self.add(name, found, in_directory=True)


def _reason(entry: ModelEntry) -> str:
    """``entry``'s reason in the index: why it is not ready when it is loaded but cannot serve
    (an ensemble whose composing model is not ready), else the one it has."""
    why = getattr(entry.runner and entry.runner.current, "not_ready_reason", None)
    if entry.state is ModelState.READY and callable(why):
        return str(why() or entry.reason)
    return entry.reason
