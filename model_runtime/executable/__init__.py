"""The executable format (``.mrx``): model, container, codec and validation."""

from model_runtime.executable.container import Executable, compute_package_hash
from model_runtime.executable.model import (
    FORMAT_VERSION,
    Anchor,
    AnchorRole,
    AnchorType,
    CustomOpRef,
    ExecutableMetadata,
    Program,
    ProgramFlow,
    ProgramKind,
    Target,
    TensorInfo,
)
from model_runtime.executable.summary import format_summary, summarize

__all__ = [
    "FORMAT_VERSION",
    "Anchor",
    "AnchorRole",
    "AnchorType",
    "CustomOpRef",
    "Executable",
    "ExecutableMetadata",
    "Program",
    "ProgramFlow",
    "ProgramKind",
    "Target",
    "TensorInfo",
    "compute_package_hash",
    "format_summary",
    "summarize",
]
