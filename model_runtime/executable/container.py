"""The ``.mrx`` container: a safetensors file holding an executable (seed: PopEF file).

Tensors are the weights, the variables' initial values and the program payloads (``uint8``);
a string constant is two tensors, its offsets and its bytes (see :mod:`.strings`).
``__metadata__`` holds one key, ``model_runtime``, whose value is the JSON document of
:class:`ExecutableMetadata`. The package hash is SHA-256 over the canonical metadata JSON (hash
field blank) and every tensor (name, dtype, shape, bytes) in name order.

Files are data only: nothing in them is ever imported, unpickled or executed as Python.

A loaded executable does not depend on its files: :meth:`Executable.load` reads every tensor
into private memory (see :mod:`.safetensors_io` for why, and what it costs) and verifies the
package hash over exactly those bytes, so a file rewritten, truncated or deleted afterwards
changes nothing, device resets included (they reload from the ``Executable``, or from the
session it is already in, not the file), until an explicit :meth:`Executable.load` reads and
verifies the file again. Before reading, the bytes the tensors will take are checked against
the allocation limit (:mod:`.limits`).

One exception, asked for explicitly (issue 34): :meth:`Executable.release` drops tensors whose
bytes now live elsewhere (a runner releases the weights its onnxruntime sessions hold a copy
of, so a served model holds its weights once). A released tensor asked for again is read again
from the files and verified against this executable's package hash (:meth:`Executable.held`):
the same bytes, or a typed error saying the file changed; never other weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from model_runtime.errors import (
    InvalidExecutableError,
    ModelRuntimeError,
    PackageHashMismatchError,
)
from model_runtime.executable.codec import metadata_from_json, metadata_to_json
from model_runtime.executable.limits import check_bytes
from model_runtime.executable.model import ExecutableMetadata, Program
from model_runtime.executable.safetensors_io import open_safetensors, write_safetensors
from model_runtime.executable.strings import string_tensor_names, unpack_strings

__all__ = ["METADATA_KEY", "Executable", "compute_package_hash"]

METADATA_KEY = "model_runtime"
PathLike = str | os.PathLike[str]


def compute_package_hash(metadata: ExecutableMetadata, tensors: Mapping[str, np.ndarray]) -> str:
    """SHA-256 (hex) over the metadata (hash field excluded) and every tensor.

    Raises:
        nothing (tensors are in memory).
    """
    h = hashlib.sha256()
    h.update(metadata_to_json(metadata, include_hash=False).encode())
    for name in sorted(tensors):
        arr = tensors[name]
        h.update(b"\0" + name.encode() + b"\0" + arr.dtype.str.encode())
        h.update(repr(tuple(arr.shape)).encode())
        h.update(np.ascontiguousarray(arr).data)
    return h.hexdigest()


class Executable:
    """A loaded (or freshly built) executable: metadata plus read-only tensor data.

    Build one with :meth:`build` (computes the hash) or :meth:`load` (verifies it).
    """

    __slots__ = ("_released", "_sources", "_tensors", "metadata")

    def __init__(
        self,
        metadata: ExecutableMetadata,
        tensors: Mapping[str, np.ndarray],
        sources: tuple[Path, ...] = (),
    ) -> None:
        self.metadata = metadata
        self._tensors = dict(tensors)
        self._sources = sources
        self._released: frozenset[str] = frozenset()

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def build(cls, metadata: ExecutableMetadata, tensors: Mapping[str, np.ndarray]) -> Executable:
        """Seal ``metadata`` and ``tensors`` into an executable with a fresh package hash.

        Raises:
            InvalidExecutableError: the metadata and tensors disagree.
        """
        from dataclasses import replace

        from model_runtime.executable.validate import validate

        tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
        sealed = replace(metadata, package_hash=compute_package_hash(metadata, tensors))
        validate(sealed, tensors, where="<built executable>")
        return cls(sealed, tensors)

    @classmethod
    def load(
        cls,
        path_or_paths: PathLike | Iterable[PathLike],
        check_package_hash: bool = True,
        *,
        limit_bytes: int | None = None,
    ) -> Executable:
        """Load an executable from one file, or assemble it from several.

        With several files, exactly one carries the metadata; the tensors of all are merged
        (a tensor name may appear in only one file). Headers and metadata are checked first;
        then, if the tensors fit ``limit_bytes`` (``None``: the configured allocation limit,
        see :mod:`.limits`), they are read into private memory and the hash is verified over
        what was read. The files are closed on return: nothing loaded depends on them.

        Raises:
            InvalidExecutableError: a file is missing, malformed or inconsistent, or changed
                while being read.
            ResourceLimitError: the tensors are bigger than the allocation limit (nothing
                large was allocated).
            PackageHashMismatchError: the contents do not match the stored hash.
            ConfigurationError: no ``limit_bytes`` given and ``MODEL_RUNTIME_FLAGS`` does not
                parse.
        """
        from model_runtime.executable.validate import validate_programs, validate_structure

        paths = (
            (Path(path_or_paths),)
            if isinstance(path_or_paths, str | os.PathLike)
            else tuple(Path(p) for p in path_or_paths)
        )
        if not paths:
            raise InvalidExecutableError("no executable files given")
        where = ", ".join(str(p) for p in paths)
        metadata: ExecutableMetadata | None = None
        tensors: dict[str, np.ndarray] = {}
        with ExitStack() as stack:
            files = [stack.enter_context(open_safetensors(path)) for path in paths]
            names: set[str] = set()
            for f in files:
                doc = f.metadata.get(METADATA_KEY)
                if doc is not None:
                    if metadata is not None:
                        raise InvalidExecutableError(
                            f"{where}: more than one file carries metadata"
                        )
                    metadata = metadata_from_json(doc, where=str(f.path))
                for name in f.tensor_names:
                    if name in names:
                        raise InvalidExecutableError(f"{where}: tensor {name!r} is in two files")
                    names.add(name)
            if metadata is None:
                raise InvalidExecutableError(f"{where}: no file carries executable metadata")
            check_bytes(
                sum(f.data_bytes for f in files),
                what=f"{where}: loading the tensors",
                limit_bytes=limit_bytes,
            )
            for f in files:
                tensors.update(f.read_tensors())
        validate_structure(metadata, tensors, where=where)
        # The hash before the ONNX parse: a tampered payload is reported as tampering, and the
        # protobuf parser only sees bytes the writer sealed (unless the caller opted out).
        # It covers the private copy, so what was verified is exactly what will run.
        if check_package_hash:
            actual = compute_package_hash(metadata, tensors)
            if actual != metadata.package_hash:
                raise PackageHashMismatchError(
                    f"{where}: package hash mismatch: stored {metadata.package_hash[:16]}..., "
                    f"contents hash to {actual[:16]}..."
                )
        validate_programs(metadata, tensors, where=where)
        return cls(metadata, tensors, paths)

    # -- persistence -------------------------------------------------------------------------

    def save(self, path: PathLike, *, tensors: Iterable[str] | None = None) -> Path:
        """Write the executable to ``path`` atomically (write to a temp file, then rename).

        ``tensors`` limits which tensors go in this file (for split models); the metadata
        always goes with the first file written this way.

        Raises:
            KeyError: ``tensors`` names a tensor the executable does not have.
            OSError: the file cannot be written.
        """
        path = Path(path)
        held = self.held()._tensors
        names = list(held) if tensors is None else list(tensors)
        data = {n: held[n] for n in names}
        meta = {METADATA_KEY: metadata_to_json(self.metadata, include_hash=True)}
        write_safetensors(path, data, meta)
        return path

    def save_split(self, program_path: PathLike, weights_path: PathLike) -> tuple[Path, Path]:
        """Write programs and metadata to one file and weights/variables to another.

        Raises:
            OSError: a file cannot be written.
        """
        held = self.held()._tensors
        payloads = {p.payload for p in self.metadata.programs if p.payload}
        rest = [n for n in held if n not in payloads]
        p = Path(program_path)
        w = Path(weights_path)
        write_safetensors(
            p,
            {n: held[n] for n in payloads},
            {METADATA_KEY: metadata_to_json(self.metadata, include_hash=True)},
        )
        write_safetensors(w, {n: held[n] for n in rest}, {})
        return p, w

    # -- access ------------------------------------------------------------------------------

    @property
    def package_hash(self) -> str:
        return self.metadata.package_hash

    @property
    def sources(self) -> tuple[Path, ...]:
        return self._sources

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return (*self._tensors, *sorted(self._released))

    @property
    def released(self) -> frozenset[str]:
        """Names of the tensors :meth:`release` dropped from memory."""
        return self._released

    def tensor(self, name: str) -> np.ndarray:
        """The stored data of tensor ``name`` (read-only; private memory when loaded; read
        again from the files and verified when it was released, see :meth:`held`).

        Raises:
            KeyError: no such tensor.
            PackageHashMismatchError, InvalidExecutableError: it was released, and the files
                no longer hold it (see :meth:`held`).
        """
        try:
            return self._tensors[name]
        except KeyError:
            if name in self._released:
                return self.held()._tensors[name]
            raise KeyError(f"executable has no tensor {name!r}") from None

    def release(self, names: Iterable[str]) -> int:
        """Drop the tensors ``names`` from memory (module docstring); the bytes released.

        The tensors kept are copied out of the buffer the file was read into, so that buffer
        goes too. An executable not loaded from files (built in memory) releases nothing: it
        could not read them again.
        """
        drop = {n for n in names if n in self._tensors}
        if not drop or not self._sources:
            return 0
        freed = sum(int(self._tensors[n].nbytes) for n in drop)
        kept: dict[str, np.ndarray] = {}
        for name, arr in self._tensors.items():
            if name not in drop:
                copy = np.array(arr, copy=True)
                copy.flags.writeable = False
                kept[name] = copy
        self._released |= drop  # first: a reader between the two lines reads the file again
        self._tensors = kept
        return freed

    def held(self) -> Executable:
        """This executable with every tensor in memory: itself, or, after :meth:`release`, a
        new load of its files whose package hash is this one's (what was released, exactly).

        Raises:
            PackageHashMismatchError: the files hold other contents now.
            InvalidExecutableError: the files are gone, truncated or malformed now.
        """
        if not self._released:
            return self
        where = ", ".join(str(p) for p in self._sources)
        why = "weights released after load (they live in the model's sessions) must be read again"
        try:
            fresh = Executable.load(self._sources)
        except PackageHashMismatchError as exc:
            raise PackageHashMismatchError(f"{why}, and the file changed: {exc}") from exc
        except ModelRuntimeError as exc:
            raise InvalidExecutableError(f"{why}, and the file cannot be read: {exc}") from exc
        if fresh.package_hash != self.package_hash:
            raise PackageHashMismatchError(
                f"{where}: {why}, but the file now holds another executable (hash "
                f"{fresh.package_hash[:16]}..., loaded {self.package_hash[:16]}...): load the "
                "model again"
            )
        return fresh

    def anchor_data(self, name: str) -> np.ndarray:
        """The stored data of anchor ``name``: its tensor (read-only), or for a string constant
        the object array of ``bytes`` its offsets and bytes tensors hold (a fresh array).

        Raises:
            KeyError: no such anchor, or it has no stored data.
        """
        a = self.metadata.anchor(name)
        if not a.has_data:
            raise KeyError(f"anchor {name!r} has no stored data")
        if a.dtype.kind != "O":
            return self.tensor(name)
        offsets, data = string_tensor_names(name)
        return unpack_strings(self.tensor(offsets), self.tensor(data), a.shape)

    def program_payload(self, program: Program | int) -> bytes:
        """The ONNX bytes of a program.

        Raises:
            KeyError: no such program, or it has no payload.
        """
        prog = program if isinstance(program, Program) else self.metadata.program(program)
        if prog.payload is None:
            raise KeyError(f"program {prog.name!r} has no payload")
        return self._tensors[prog.payload].tobytes()

    def total_tensor_bytes(self) -> int:
        """Bytes of the tensors held in memory (released ones not counted)."""
        return sum(int(a.nbytes) for a in self._tensors.values())

    def describe(self) -> dict[str, Any]:
        """A JSON-able description (used by ``model-runtime inspect``)."""
        return json.loads(metadata_to_json(self.metadata, include_hash=True))  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        m = self.metadata
        return (
            f"Executable(model={m.model_name!r}, target={m.target.device_kind!r}, "
            f"batch_size={m.batch_size}, hash={m.package_hash[:12]})"
        )
