"""Compile options: what an executable is compiled for, and their canonical form for the cache."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from model_runtime.errors import CompileError
from model_runtime.executable.model import DEVICE_KINDS, Target

__all__ = ["OPTIMIZATION_LEVELS", "CompileOptions"]

#: onnxruntime graph optimisation levels, by the names the CLI and options use.
OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")

#: IPU architecture versions the ipu-model target simulates.
IPU_VERSIONS = (1, 2, 21)


@dataclass(frozen=True, slots=True)
class CompileOptions:
    """How to compile an ONNX model into an executable.

    ``variables`` names initializers that are mutable state (uploaded by the load program,
    downloaded by the save program); ``variable_updates`` maps a graph output to the variable
    whose new value it is. ``executable_cache_path`` (or ``MODEL_RUNTIME_FLAGS``) enables the
    executable cache; it does not change what is compiled.

    ``batch_size=0`` compiles a model without a batch axis (Triton's ``max_batch_size: 0``):
    its inputs keep their own, fully fixed shapes, no anchor has a ``batch_dim``, and the
    executable runs each request on its own (its metadata says batch size 1).
    """

    batch_size: int = 1
    device_iterations: int = 1
    replication_factor: int = 1
    target: str = "cpu"
    ipu_version: int = 2
    tiles_per_ipu: int = 0
    variables: tuple[str, ...] = ()
    variable_updates: Mapping[str, str] = field(default_factory=dict)
    batch_dim: int = 0
    optimization_level: str = "extended"
    executable_cache_path: str | None = None
    model_name: str | None = None
    #: Let the main program also run smaller batches (1, 2, 4, ... up to ``batch_size``) when
    #: it computes every row independently whatever the batch (checked by running it): the
    #: queue then runs a lone request at batch 1 instead of padding it to ``batch_size``.
    batch_buckets: bool = True

    def __post_init__(self) -> None:
        # Frozen and hashable: store immutable copies of the collection fields.
        object.__setattr__(self, "variables", tuple(self.variables))
        object.__setattr__(self, "variable_updates", MappingProxyType(dict(self.variable_updates)))

    def __hash__(self) -> int:
        return hash(self.canonical_json())

    def validate(self, model: str) -> None:
        """Check every option; ``model`` names the model in messages.

        Raises:
            CompileError: naming the model and the bad option.
        """

        def fail(what: str) -> CompileError:
            return CompileError(f"cannot compile {model}: {what}")

        for name in ("batch_size", "device_iterations", "replication_factor"):
            value = getattr(self, name)
            least = 0 if name == "batch_size" else 1  # batch 0: no batch axis
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                also = " (or 0: no batch axis)" if least == 0 else ""
                raise fail(f"{name} must be a positive integer{also}, got {value!r}")
        if self.batch_size == 0 and self.device_iterations != 1:
            raise fail("a model without a batch axis (batch_size 0) runs one device iteration")
        if self.target not in DEVICE_KINDS:
            raise fail(f"unknown target {self.target!r} (known: {', '.join(DEVICE_KINDS)})")
        if self.target == "ipu-model":
            if self.ipu_version not in IPU_VERSIONS:
                raise fail(
                    f"unknown ipu_version {self.ipu_version!r} "
                    f"(known: {', '.join(map(str, IPU_VERSIONS))})"
                )
            if not isinstance(self.tiles_per_ipu, int) or self.tiles_per_ipu < 0:
                raise fail(f"tiles_per_ipu must be >= 0, got {self.tiles_per_ipu!r}")
        if not isinstance(self.batch_dim, int) or self.batch_dim < 0:
            raise fail(f"batch_dim must be >= 0, got {self.batch_dim!r}")
        if self.optimization_level not in OPTIMIZATION_LEVELS:
            raise fail(
                f"unknown optimization_level {self.optimization_level!r} "
                f"(known: {', '.join(OPTIMIZATION_LEVELS)})"
            )
        if len(set(self.variables)) != len(self.variables):
            raise fail(f"variables listed twice: {sorted(self.variables)}")
        for out, var in self.variable_updates.items():
            if var not in self.variables:
                raise fail(
                    f"variable_updates maps output {out!r} to {var!r}, which is not one of the "
                    f"variables {list(self.variables)}"
                )
        updated = list(self.variable_updates.values())
        if len(set(updated)) != len(updated):
            raise fail("two outputs update the same variable")

    @property
    def device_target(self) -> Target:
        """The executable's :class:`Target` for these options."""
        if self.target == "ipu-model":
            return Target(
                device_kind="ipu-model",
                num_devices=1,
                version=self.ipu_version,
                tiles_per_ipu=self.tiles_per_ipu,
            )
        return Target(device_kind=self.target)

    def canonical(self) -> dict[str, Any]:
        """The options that change the compiled executable, as plain JSON values.

        ``executable_cache_path`` is left out: where the cache lives does not change the result.
        """
        return {
            "batch_size": self.batch_size,
            "device_iterations": self.device_iterations,
            "replication_factor": self.replication_factor,
            "target": self.target,
            "ipu_version": self.ipu_version if self.target == "ipu-model" else 0,
            "tiles_per_ipu": self.tiles_per_ipu if self.target == "ipu-model" else 0,
            "variables": sorted(self.variables),
            "variable_updates": dict(sorted(self.variable_updates.items())),
            "batch_dim": self.batch_dim,
            "optimization_level": self.optimization_level,
            "model_name": self.model_name,
            "batch_buckets": self.batch_buckets,
        }

    def canonical_json(self) -> str:
        """:meth:`canonical` as compact JSON with sorted keys (stable across runs)."""
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
