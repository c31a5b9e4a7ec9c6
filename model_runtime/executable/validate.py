"""Consistency checks between an executable's metadata and its tensors."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from model_runtime.errors import InvalidExecutableError
from model_runtime.executable.model import DEVICE_KINDS, AnchorRole, ExecutableMetadata

__all__ = ["MAX_ANCHOR_ELEMENTS", "validate"]

#: No anchor may describe more elements than this (2**34 fp32 = 64 GiB): absurd shapes are
#: rejected before anything is sized from them.
MAX_ANCHOR_ELEMENTS = 1 << 34


def validate(
    metadata: ExecutableMetadata, tensors: Mapping[str, np.ndarray], *, where: str
) -> None:
    """Check that ``metadata`` is self-consistent and agrees with ``tensors``.

    Raises:
        InvalidExecutableError: naming ``where`` and the first defect found.
    """

    def fail(what: str) -> InvalidExecutableError:
        return InvalidExecutableError(f"{where}: {what}")

    m = metadata
    if m.target.device_kind not in DEVICE_KINDS:
        raise fail(
            f"unknown target device kind {m.target.device_kind!r} "
            f"(known: {', '.join(DEVICE_KINDS)})"
        )
    program_ids = [p.id for p in m.programs]
    if len(set(program_ids)) != len(program_ids):
        raise fail("duplicate program ids")
    known = set(program_ids)
    for stage, ids in (
        ("load", m.program_flow.load),
        ("main", m.program_flow.main),
        ("save", m.program_flow.save),
    ):
        for pid in ids:
            if pid not in known:
                raise fail(f"program flow {stage} names unknown program {pid}")
    for p in m.programs:
        if p.payload is not None:
            payload = tensors.get(p.payload)
            if payload is None:
                raise fail(f"program {p.name!r}: payload tensor {p.payload!r} is missing")
            if payload.dtype != np.uint8 or payload.ndim != 1:
                raise fail(f"program {p.name!r}: payload {p.payload!r} is not a 1-d uint8 tensor")
    names: set[str] = set()
    for a in m.anchors:
        if not a.name:
            raise fail("an anchor has an empty name")
        if a.name in names:
            raise fail(f"duplicate anchor name {a.name!r}")
        names.add(a.name)
        n = 1
        for d in a.tensor_info.shape:
            n *= d
            if n > MAX_ANCHOR_ELEMENTS:
                raise fail(f"anchor {a.name!r}: absurd shape {a.tensor_info.shape}")
        for pid in a.programs:
            if pid not in known:
                raise fail(f"anchor {a.name!r} names unknown program {pid}")
        if a.batch_dim is not None and a.batch_dim >= len(a.tensor_info.shape):
            raise fail(f"anchor {a.name!r}: batch_dim {a.batch_dim} beyond its rank")
        if a.has_data:
            t = tensors.get(a.name)
            if t is None:
                raise fail(f"anchor {a.name!r} has data but the tensor is missing")
            if tuple(t.shape) != a.tensor_info.shape or t.dtype != a.tensor_info.dtype:
                raise fail(
                    f"anchor {a.name!r} is {a.tensor_info.dtype.name}{list(a.tensor_info.shape)} "
                    f"but its tensor is {t.dtype.name}{list(t.shape)}"
                )
        elif a.role in (AnchorRole.WEIGHT, AnchorRole.VARIABLE):
            raise fail(f"anchor {a.name!r} is a {a.role.value} without data")
    for out, var in m.output_to_variable.items():
        if out not in names or var not in names:
            raise fail(f"output_to_variable maps {out!r} -> {var!r}: unknown anchor")
