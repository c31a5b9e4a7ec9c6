"""Reading the ONNX model to compile: from a path, bytes or a ``ModelProto``; checking it."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx.external_data_helper import uses_external_data

from model_runtime.compiler.graph import approx_bytes
from model_runtime.errors import CompileError

__all__ = ["ModelLike", "ModelSource", "load_source"]

ModelLike = str | os.PathLike[str] | bytes | onnx.ModelProto

#: Protobuf cannot serialise a message past 2 GiB; bigger models are checked by path.
_PROTO_LIMIT = (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A loaded, checked model and what identifies it.

    ``sha256`` covers the model bytes and the bytes of any external data files it references,
    so the executable cache key changes when either changes.
    """

    proto: onnx.ModelProto
    name: str
    sha256: str
    path: Path | None


def _describe(model: ModelLike) -> str:
    if isinstance(model, onnx.ModelProto):
        return f"model {model.graph.name or '<unnamed>'!r}"
    if isinstance(model, bytes):
        return "model <bytes>"
    return f"model {os.fspath(model)!r}"


def _external_files(proto: onnx.ModelProto) -> list[str]:
    locations: set[str] = set()
    for tensor in proto.graph.initializer:
        if uses_external_data(tensor):
            for entry in tensor.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
    return sorted(locations)


def load_source(model: ModelLike, model_name: str | None = None) -> ModelSource:
    """Load ``model`` (path, serialized bytes or proto), with external data, and check it.

    Raises:
        CompileError: the file is missing or unreadable, is not an ONNX model, or fails
            ``onnx.checker``; the message names the model.
    """
    where = _describe(model)
    digest = hashlib.sha256()
    path: Path | None = None
    if isinstance(model, onnx.ModelProto):
        proto = model
        digest.update(proto.SerializeToString())
    else:
        if isinstance(model, bytes):
            raw = model
        else:
            path = Path(model)
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise CompileError(f"cannot read {where}: {exc.strerror or exc}") from exc
        digest.update(raw)
        try:
            proto = onnx.load_model_from_string(raw)
        except Exception as exc:  # protobuf raises DecodeError, and others on odd bytes
            raise CompileError(
                f"{where} is not an ONNX model (the protobuf does not parse)"
            ) from exc
        if not proto.graph.node and not proto.graph.output:
            # Protobuf parses many non-ONNX byte strings into an empty message.
            raise CompileError(f"{where} is not an ONNX model (no graph, no nodes, no outputs)")
        external = _external_files(proto)
        if external:
            if path is None:
                raise CompileError(
                    f"{where} references external data files {external}; pass it by path"
                )
            for location in external:
                try:
                    digest.update(b"\0" + location.encode() + b"\0")
                    digest.update((path.parent / location).read_bytes())
                except OSError as exc:
                    raise CompileError(
                        f"{where}: cannot read its external data file {location!r}: {exc}"
                    ) from exc
            try:
                onnx.load_external_data_for_model(proto, str(path.parent))
            except Exception as exc:
                raise CompileError(f"{where}: bad external data: {exc}") from exc

    name = model_name or (path.stem if path is not None else "") or proto.graph.name or "model"
    _check(proto, path, where)
    return ModelSource(proto=proto, name=name, sha256=digest.hexdigest(), path=path)


def _check(proto: onnx.ModelProto, path: Path | None, where: str) -> None:
    try:
        if approx_bytes(proto) > _PROTO_LIMIT and path is not None:
            onnx.checker.check_model(str(path))
        else:
            onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CompileError(f"{where} fails onnx.checker: {first}") from exc
    except Exception as exc:
        raise CompileError(f"{where} cannot be checked: {exc}") from exc
