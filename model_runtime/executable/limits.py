"""Memory an executable makes the runtime allocate, checked against a limit before allocating.

A file's metadata decides how much memory the runtime takes for it, and a valid package hash
says nothing about whether that is sane: ``device_iterations=10**6`` in a sealed file would have
numpy asked for terabytes of ring pool (a bare ``MemoryError``), or given gigabytes lazily until
the OOM killer takes the whole process, every other model of a daemon with it. So what a model
will hold is computed from the metadata first and refused with
:class:`~model_runtime.errors.ResourceLimitError` when it is over the limit:

* ``tensors``: the executable's tensors, read into private memory at load (one copy per loaded
  executable, shared by its replicas and resets; see :mod:`.safetensors_io`);
* per replica, ``pool``: the Queue's ring memory pool, ``ring_buffer_size_multiplier`` batch
  buffers of ``device_iterations`` batches of every user input (an anchor's shape already holds
  the batch size);
* per replica, ``outputs``: one main run's outputs, ``device_iterations`` batches of every user
  output (fresh arrays from onnxruntime);
* per replica, ``device``: the device's own copy of the weights and variables (the cpu backend
  keeps one; the ipu-model backend is a cpu backend).

String anchors (numpy ``object`` arrays of ``bytes``) count one pointer (8 bytes) per element:
their pool buffers hold references to the callers' strings, whose bytes the request (and the
daemon's body limit) already bounds.

The limit: ``limit_bytes`` when given, else ``--max_allocation_bytes`` in ``MODEL_RUNTIME_FLAGS``,
else half the memory this process may use (physical memory, or the cgroup v2/v1 memory limit
when lower). Half, because the estimate counts only what the runtime allocates up front:
onnxruntime's arenas and activations, Python, and the other models of the process come on top,
and a start that already claims more than half of the memory is almost always a damaged or
mis-built file, not a model worth risking the OOM killer for. A fixed figure would be wrong on
both a 4 GiB container and a 1 TiB server. The limit is per model (each check stands alone),
not a budget shared between models.

:func:`check_allocation` is what a runner calls before building its replicas;
:func:`check_bytes` is what the loader calls before reading tensors.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from model_runtime.errors import ResourceLimitError
from model_runtime.executable.model import Anchor, ExecutableMetadata
from model_runtime.flags import ENV_VAR, get_flags

__all__ = [
    "DEFAULT_MEMORY_FRACTION",
    "FALLBACK_LIMIT_BYTES",
    "AllocationEstimate",
    "check_allocation",
    "check_bytes",
    "default_limit_bytes",
    "estimate_allocation",
    "process_memory_bytes",
]

#: Share of the memory this process may use that one executable may claim by default.
DEFAULT_MEMORY_FRACTION = 0.5
#: The default limit where the machine's memory cannot be read (not Linux/macOS).
FALLBACK_LIMIT_BYTES = 8 << 30

_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


@dataclass(frozen=True, slots=True)
class AllocationEstimate:
    """Bytes a model will hold once started (see the module docstring); ``total`` sums them."""

    tensors: int
    pool: int
    outputs: int
    device: int
    replicas: int

    @property
    def per_replica(self) -> int:
        return self.pool + self.outputs + self.device

    @property
    def total(self) -> int:
        return self.tensors + self.replicas * self.per_replica


def _anchor_bytes(anchors: tuple[Anchor, ...]) -> int:
    return sum(a.tensor_info.size_in_bytes for a in anchors)


def estimate_allocation(
    metadata: ExecutableMetadata,
    ring_buffer_size_multiplier: int,
    *,
    replicas: int = 1,
    tensor_bytes: int | None = None,
) -> AllocationEstimate:
    """What a model with ``metadata`` will hold when started with ``replicas`` replicas.

    ``tensor_bytes``: the loaded executable's tensor bytes (``Executable.total_tensor_bytes``);
    ``None`` counts the weights and variables the metadata describes (not the payloads).
    Pure arithmetic on the metadata: allocates nothing, whatever the numbers.

    Raises:
        nothing.
    """
    iterations = max(1, metadata.device_iterations)
    device = _anchor_bytes(metadata.weights) + _anchor_bytes(metadata.variables)
    return AllocationEstimate(
        tensors=device if tensor_bytes is None else tensor_bytes,
        pool=ring_buffer_size_multiplier * iterations * _anchor_bytes(metadata.user_inputs),
        outputs=iterations * _anchor_bytes(metadata.user_outputs),
        device=device,
        replicas=replicas,
    )


@functools.cache
def process_memory_bytes() -> int | None:
    """Memory this process may use: physical memory, or the cgroup's limit when lower
    (``None`` where neither can be read).

    Raises:
        nothing.
    """
    found: list[int] = []
    try:
        found.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        pass
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) > 0:
            found.append(int(text))  # "max" (v2) or a huge number (v1) when unlimited
    found = [n for n in found if n > 0]
    return min(found) if found else None


def default_limit_bytes() -> tuple[int, str]:
    """The limit when none is given, and where it comes from (for error messages).

    Raises:
        ConfigurationError: ``MODEL_RUNTIME_FLAGS`` does not parse.
    """
    flag = get_flags().max_allocation_bytes
    if flag is not None:
        return flag, f"{ENV_VAR}=--max_allocation_bytes"
    memory = process_memory_bytes()
    if memory is None:
        return FALLBACK_LIMIT_BYTES, f"the default; set {ENV_VAR}=--max_allocation_bytes=N"
    return (
        int(memory * DEFAULT_MEMORY_FRACTION),
        f"half of the {_fmt(memory)} this process may use; "
        f"set {ENV_VAR}=--max_allocation_bytes=N to change it",
    )


def _limit(limit_bytes: int | None) -> tuple[int, str]:
    if limit_bytes is None:
        return default_limit_bytes()
    return limit_bytes, "limit_bytes"


def _fmt(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def check_bytes(needed: int, *, what: str, limit_bytes: int | None = None) -> None:
    """Refuse to allocate ``needed`` bytes for ``what`` when over the limit.

    Raises:
        ResourceLimitError: ``needed`` is over the limit (the message says what and the limit).
        ConfigurationError: no ``limit_bytes`` given and ``MODEL_RUNTIME_FLAGS`` does not parse.
    """
    limit, source = _limit(limit_bytes)
    if needed > limit:
        raise ResourceLimitError(
            f"{what} needs {_fmt(needed)}, over the allocation limit of {_fmt(limit)} ({source})",
            needed=needed,
            limit=limit,
        )


def check_allocation(
    metadata: ExecutableMetadata,
    ring_buffer_size_multiplier: int,
    limit_bytes: int | None = None,
    *,
    replicas: int = 1,
    tensor_bytes: int | None = None,
) -> AllocationEstimate:
    """Check what a model with ``metadata`` will hold (see :func:`estimate_allocation`) against
    ``limit_bytes`` (``None``: the configured default); return the estimate when it fits.

    Call it before building the replicas: it allocates nothing, so a file whose metadata
    implies terabytes fails here in microseconds.

    Raises:
        ResourceLimitError: the estimate's total is over the limit; the message breaks it down.
        ConfigurationError: no ``limit_bytes`` given and ``MODEL_RUNTIME_FLAGS`` does not parse.
    """
    estimate = estimate_allocation(
        metadata, ring_buffer_size_multiplier, replicas=replicas, tensor_bytes=tensor_bytes
    )
    limit, source = _limit(limit_bytes)
    if estimate.total > limit:
        m = metadata
        raise ResourceLimitError(
            f"model {m.model_name!r} would hold {_fmt(estimate.total)} once started, over the "
            f"allocation limit of {_fmt(limit)} ({source}): per replica x{replicas}, ring pool "
            f"{_fmt(estimate.pool)} (ring_buffer_size_multiplier {ring_buffer_size_multiplier} "
            f"x device_iterations {m.device_iterations} x "
            f"{_fmt(_anchor_bytes(m.user_inputs))} of user inputs), run outputs "
            f"{_fmt(estimate.outputs)}, device copies {_fmt(estimate.device)}; "
            f"tensors {_fmt(estimate.tensors)}",
            needed=estimate.total,
            limit=limit,
        )
    return estimate
