"""What the daemon's model repository knows of each model: its entry (state, runner, what it
serves, counters), the control modes and repository states of Triton's protocol, and how a
model named on the command line is read (see :mod:`model_runtime.server.repository.repository`)."""

from __future__ import annotations

import asyncio
import enum
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from google.protobuf.message import Message

from model_runtime.errors import InputValidationError
from model_runtime.sequences import SequenceTable
from model_runtime.server.serving import ServingRunner
from model_runtime.server.tensors.request import TensorSpec
from model_runtime.server.triton.layout import is_model_dir
from model_runtime.server.triton.settings import ModelSettings

__all__ = [
    "NAME_PATTERN",
    "SUFFIXES",
    "ControlMode",
    "Fingerprint",
    "ModelEntry",
    "ModelState",
    "ModelStats",
    "parse_model_arg",
    "resolve_in",
]

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
SUFFIXES = (".mrx", ".onnx")
Fingerprint = tuple[object, ...]


class ControlMode(enum.Enum):
    """Triton's ``--model-control-mode``: who decides which models are loaded.

    ``NONE``: every model is loaded at start; the repository API cannot load or unload.
    ``EXPLICIT``: the repository API loads and unloads; the daemon loads ``--load-model`` at
    start. ``POLL``: the files decide; the repository is polled for added, changed and removed
    model files; the API cannot load or unload.
    """

    NONE = "none"
    EXPLICIT = "explicit"
    POLL = "poll"


class ModelState(enum.Enum):
    """Repository states (names from the protocol's repository extension)."""

    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"


@dataclass(slots=True)
class ModelStats:
    """Counters the daemon keeps per model (the protocol's statistics extension)."""

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    inference_count: int = 0
    last_inference_ms: int = 0

    def record(self, ok: bool, duration_ns: int, samples: int) -> None:
        """Count one finished request."""
        if ok:
            self.success_count += 1
            self.success_ns += duration_ns
            self.inference_count += samples
        else:
            self.fail_count += 1
            self.fail_ns += duration_ns
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_ok(self, count: int, duration_ns: int, samples: int) -> None:
        """Count ``count`` requests that succeeded, in ``duration_ns`` and ``samples`` in all."""
        self.success_count += count
        self.success_ns += duration_ns
        self.inference_count += samples
        self.last_inference_ms = time.time_ns() // 1_000_000


@dataclass(slots=True)
class ModelEntry:
    """One model the repository knows, loaded or not.

    ``wanted``: the model should be loaded (asked for at start, by a load or by the poll; an
    unload clears it): what strict readiness waits for. ``loads`` / ``load_failures`` count
    versions loaded and loads that failed. ``fingerprint`` is the file as last loaded (or
    tried): the poll reloads when it changes.
    """

    name: str
    source: Path
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    runner: ServingRunner | None = None
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    datatypes: dict[str, str] = field(default_factory=dict)
    stats: ModelStats = field(default_factory=ModelStats)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    stop: anyio.Event | None = None
    in_directory: bool = False
    wanted: bool = False
    fingerprint: Fingerprint | None = None
    loads: int = 0
    load_failures: int = 0
    #: The version this entry serves (a model's entry: its highest version served).
    version: str = "1"
    #: The model's own settings (config.pbtxt or TOML) as last loaded; None before.
    settings: ModelSettings | None = None
    #: The ``ModelConfig`` (Triton's) of what this version serves; None while not loaded.
    served: Message | None = None
    #: A stateful model's live sequences, handed to its next version by a reload when the
    #: sequence settings stay the same (:mod:`model_runtime.sequences`).
    sequences: SequenceTable | None = None
    #: The model's other versions served, by version (empty but for Triton's version policy).
    versions: dict[str, ModelEntry] = field(default_factory=dict)

    def version_entry(self, version: str) -> ModelEntry | None:
        """The entry of ``version`` of this model, or None when that version is not served."""
        if version == self.version:
            return self
        return self.versions.get(version)

    def served_versions(self) -> list[str]:
        """Every version of this model served now, in ascending order."""
        if self.runner is None:
            return []
        return sorted([self.version, *self.versions], key=int)

    @property
    def platform(self) -> str:
        """The platform its served config names (``onnxruntime_onnx``; empty for a python
        model, whose config names a backend), as Triton's model metadata says it."""
        return str(getattr(self.served, "platform", ""))

    @property
    def is_ready(self) -> bool:
        """True when loaded and at least one replica is ready."""
        return self.state is ModelState.READY and self.runner is not None and self.runner.is_ready


def parse_model_arg(arg: str) -> tuple[str, Path]:
    """Split a ``NAME=PATH`` or ``PATH`` command-line model into its name and path.

    Raises:
        InputValidationError: the name is not a valid model name or the suffix is unknown.
    """
    name, eq, path = arg.partition("=")
    p = Path(path if eq else arg)
    if not eq:
        name = p.stem
    if not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise InputValidationError(f"invalid model name {name!r} (letters, digits, _ . -)")
    if p.suffix not in SUFFIXES and not is_model_dir(p):
        raise InputValidationError(
            f"model {str(p)!r} must be an .mrx or .onnx file or a Triton model directory"
        )
    return name, p


def resolve_in(directory: Path, name: str) -> Path | None:
    """The file of ``name`` in ``directory`` (``.mrx`` first), else its model directory."""
    for suffix in SUFFIXES:
        candidate = (directory / f"{name}{suffix}").resolve()
        if candidate.parent == directory and candidate.is_file():
            return candidate
    candidate = (directory / name).resolve()
    if candidate.parent == directory and is_model_dir(candidate):
        return candidate
    return None
