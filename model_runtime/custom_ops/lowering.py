"""Compile time and load time of custom ops: lowering ONNX nodes, preparing sessions.

Compile (:func:`lower`): every node whose domain is not a standard ONNX/onnxruntime domain (nor
a model-local function) names a custom op library (the domain) and op (the op type). The
library is imported from the allow-list, the op's build function is called with the node's
input tensor infos and attributes, the kernel is probed once on ones to check it returns what it
declares, and the node is rewritten into a kernel node (:mod:`.kernels`) whose ``mr_spec``
attribute carries the library, op, attributes and tensor infos as JSON data.

Load (:func:`prepare_session`): for an executable's ``custom_ops``, each library must be on the
allow-list *of the loading process* and hash to what was compiled; its build functions are
called again from the stored specs and the kernels installed. Nothing is ever imported by a name
that is not on the allow-list, and no code is read from the file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from model_runtime.custom_ops import kernels
from model_runtime.custom_ops.api import Kernel
from model_runtime.custom_ops.libraries import Library, load_library
from model_runtime.errors import CustomOpError
from model_runtime.executable.model import CustomOpRef, TensorInfo

if TYPE_CHECKING:
    from model_runtime.executable import Executable

__all__ = [
    "Cacheability",
    "cacheability",
    "check_cacheable",
    "custom_op_nodes",
    "lower",
    "prepare_session",
]

#: Domains of ONNX and onnxruntime ops (everything else names a custom op library).
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "com.microsoft"})


def custom_op_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The top-level nodes of ``model`` that name a custom op library."""
    local = {(f.domain, f.name) for f in model.functions}
    return [
        n
        for n in model.graph.node
        if n.domain not in STANDARD_DOMAINS
        and n.domain != kernels.DOMAIN
        and (n.domain, n.op_type) not in local
    ]


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        elif isinstance(value, list):
            value = [v.decode() if isinstance(v, bytes) else v for v in value]
        if not isinstance(value, str | int | float | list):
            raise CustomOpError(
                f"custom op node {node.name or node.op_type!r}: attribute {attr.name!r} has a type "
                "custom ops do not take (use ints, floats, strings or lists of them)"
            )
        out[attr.name] = value
    return out


def build_kernel(
    library: Library,
    op_name: str,
    inputs: Sequence[TensorInfo],
    attributes: Mapping[str, Any],
    where: str,
) -> kernels.LoadedKernel:
    """Call the op's build function and check what it returns.

    Raises:
        CustomOpError: no such op, the build function raises or returns no :class:`Kernel`, or
            an elementwise op's inputs or outputs do not share one shape.
    """
    op = library.op(op_name, where)
    name = f"{library.name}:{op_name}"
    try:
        kernel = op.build(tuple(inputs), dict(attributes))
    except CustomOpError:
        raise
    except Exception as exc:
        raise CustomOpError(
            f"{where}: the build function of custom op {name} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(kernel, Kernel) or not callable(kernel.compute):
        raise CustomOpError(
            f"{where}: the build function of custom op {name} returned {type(kernel).__name__}, "
            "not a Kernel(outputs=..., compute=...)"
        )
    if op.is_elementwise:
        shapes = {i.shape for i in inputs} | {o.shape for o in kernel.outputs}
        if len(shapes) > 1:
            raise CustomOpError(
                f"{where}: custom op {name} is declared elementwise but its inputs and outputs "
                f"have shapes {sorted(shapes)}; give it tensors of one shape or declare "
                "is_elementwise=False"
            )
    return kernels.LoadedKernel(name=name, kernel=kernel, is_elementwise=op.is_elementwise)


def _infos(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model
    g = inferred.graph
    out: dict[str, TensorInfo] = {}
    for vi in (*g.input, *g.value_info, *g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape") or not tt.elem_type:
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        out[vi.name] = TensorInfo(dims, np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)))
    for t in g.initializer:
        out[t.name] = TensorInfo(
            tuple(t.dims), np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
        )
    return out


def _info_json(info: TensorInfo) -> list[Any]:
    return [list(info.shape), info.dtype.name]


def lower(
    model: onnx.ModelProto, allowed: Iterable[str] | None = None, *, where: str = "model"
) -> tuple[onnx.ModelProto, tuple[CustomOpRef, ...]]:
    """Rewrite custom op nodes into kernel nodes; return the model and the ops it uses.

    ``allowed`` overrides the process allow-list. A model without custom ops comes back as is.

    Raises:
        CustomOpError: a library is not allowed or broken, an op is missing, a build function
            fails, an input's shape cannot be inferred, or the probe run returns outputs that
            do not match what the kernel declares.
    """
    if not custom_op_nodes(model):
        return model, ()
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    refs: dict[tuple[str, str], CustomOpRef] = {}
    libraries: dict[str, Library] = {}
    domains: set[str] = set()
    for index, node in enumerate(list(graph.node)):
        if node not in custom_op_nodes(out):
            continue
        label = f"{where}: node {node.name or node.op_type!r}"
        lib = libraries.get(node.domain) or load_library(node.domain, label, allowed)
        libraries[node.domain] = lib
        infos = _infos(out)
        missing = [name for name in node.input if name and name not in infos]
        if missing:
            raise CustomOpError(
                f"{label}: the shape of input(s) {missing} of custom op {node.domain}:"
                f"{node.op_type} cannot be inferred; give them a value_info with a shape"
            )
        inputs = [infos[name] for name in node.input if name]
        attrs = _attributes(node)
        loaded = build_kernel(lib, node.op_type, inputs, attrs, label)
        if len(loaded.kernel.outputs) != len(node.output):
            raise CustomOpError(
                f"{label}: custom op {loaded.name} declares {len(loaded.kernel.outputs)} outputs "
                f"but the node has {len(node.output)}"
            )
        probe = [np.ones(tuple(max(d, 1) for d in i.shape), dtype=i.dtype) for i in inputs]
        kernels.run_kernel(loaded, probe)
        spec = json.dumps(
            {
                "library": lib.name,
                "op": node.op_type,
                "attributes": attrs,
                "inputs": [_info_json(i) for i in inputs],
                "outputs": [_info_json(o) for o in loaded.kernel.outputs],
            },
            sort_keys=True,
        )
        op_type = kernels.op_type_for(
            [i.dtype for i in inputs], [o.dtype for o in loaded.kernel.outputs]
        )
        kernels.install(spec, loaded, op_type)
        new = helper.make_node(
            op_type, list(node.input), list(node.output), name=node.name, domain=kernels.DOMAIN
        )
        new.attribute.append(helper.make_attribute(kernels.SPEC_ATTR, spec))
        graph.node.remove(graph.node[index])
        graph.node.insert(index, new)
        for name, info in zip(node.output, loaded.kernel.outputs, strict=True):
            dims: list[int | str] = [
                d if d >= 0 else f"{name}_d{i}" for i, d in enumerate(info.shape)
            ]
            elem = helper.np_dtype_to_tensor_dtype(info.dtype)
            graph.value_info.append(helper.make_tensor_value_info(name, elem, dims))
        domains.add(node.domain)
        op = lib.op(node.op_type, label)
        refs[(lib.name, node.op_type)] = CustomOpRef(
            lib.name, node.op_type, lib.hash, op.is_hashable
        )
    kept = [o for o in out.opset_import if o.domain not in domains and o.domain != kernels.DOMAIN]
    del out.opset_import[:]
    out.opset_import.extend([*kept, helper.make_opsetid(kernels.DOMAIN, 1)])
    return out, tuple(refs[k] for k in sorted(refs))


@dataclass(frozen=True, slots=True)
class Cacheability:
    """Whether an executable of a model may be cached or pre-compiled (:func:`cacheability`).

    ``fingerprint`` hashes the custom op libraries used (``""`` for none): it goes into the
    executable cache key so a changed library is compiled again. ``unhashable`` names
    (``library:op``) the ops not marked hashable; any one makes the model uncacheable.
    """

    fingerprint: str
    unhashable: tuple[str, ...] = ()

    @property
    def cacheable(self) -> bool:
        """True when no op used is unhashable."""
        return not self.unhashable

    def reason(self, purpose: str) -> str:
        """Why the executable cannot be ``purpose`` ("cached", "pre-compiled"); ``""`` if it can."""
        if self.cacheable:
            return ""
        ops = ", ".join(self.unhashable)
        which = "op " + ops + ", which is" if len(self.unhashable) == 1 else f"ops {ops}, which are"
        return (
            f"the model uses custom {which} not marked hashable, so its executable cannot be "
            f"{purpose}. Declare it with CustomOp(..., is_hashable=True) if its result depends "
            "only on its source"
        )


def cacheability(model: onnx.ModelProto, allowed: Iterable[str] | None = None) -> Cacheability:
    """The custom op libraries' fingerprint and the ops that forbid caching ``model``.

    Seed 001: custom ops whose ``is_hashable`` is not set cannot be pre-compiled (nor cached);
    they still compile and run, just not through the executable cache.

    Raises:
        CustomOpError: a library is not allowed, cannot be imported, or lacks the op.
    """
    digest = hashlib.sha256()
    unhashable: list[str] = []
    seen = False
    for node in custom_op_nodes(model):
        label = f"node {node.name or node.op_type!r}"
        lib = load_library(node.domain, label, allowed)
        op = lib.op(node.op_type, label)
        name = f"{lib.name}:{node.op_type}"
        if not op.is_hashable and name not in unhashable:
            unhashable.append(name)
        digest.update(f"{name}:{lib.hash};".encode())
        seen = True
    return Cacheability(digest.hexdigest() if seen else "", tuple(unhashable))


def check_cacheable(
    model: onnx.ModelProto, purpose: str, allowed: Iterable[str] | None = None
) -> str:
    """Refuse to cache or pre-compile a model that uses a custom op not marked hashable.

    Returns :attr:`Cacheability.fingerprint`. ``purpose`` says what was asked ("cached",
    "pre-compiled") for the message. Callers that can go on without the cache use
    :func:`cacheability` instead.

    Raises:
        CustomOpError: an op is not hashable (named), or a library is not allowed or broken.
    """
    c = cacheability(model, allowed)
    if not c.cacheable:
        raise CustomOpError(c.reason(purpose))
    return c.fingerprint


def prepare_session(session_options: Any, executable: Executable) -> None:
    """Install the kernels ``executable`` needs and enable them in ``session_options``.

    Call before creating the onnxruntime session of its main program. A no-op for an
    executable without custom ops.

    Raises:
        CustomOpError: a library is not on this process's allow-list, cannot be imported, has
            changed since compiling, or its build function fails.
    """
    meta = executable.metadata
    if not meta.custom_ops:
        return
    where = f"model {meta.model_name!r}"
    libraries: dict[str, Library] = {}
    for ref in meta.custom_ops:
        if ref.library not in libraries:
            libraries[ref.library] = load_library(ref.library, where, None, ref.library_hash)
    payloads = [executable.program_payload(p) for p in meta.programs if p.payload]
    for payload in payloads:
        graph = onnx.load_model_from_string(payload).graph
        for node in graph.node:
            if node.domain != kernels.DOMAIN or not node.op_type.startswith(kernels.OP_PREFIX):
                continue
            specs = [a for a in node.attribute if a.name == kernels.SPEC_ATTR]
            spec = helper.get_attribute_value(specs[0]) if specs else b""
            spec_text = spec.decode() if isinstance(spec, bytes) else str(spec)
            if kernels.is_installed(spec_text):
                continue
            try:
                doc = json.loads(spec_text)
                lib = libraries[doc["library"]]
                inputs = [TensorInfo(tuple(s), np.dtype(d)) for s, d in doc["inputs"]]
                attrs = doc["attributes"]
                op_name = doc["op"]
            except (ValueError, KeyError, TypeError) as exc:
                raise CustomOpError(
                    f"{where}: custom op node {node.name!r} names a library not listed in the "
                    f"executable's custom ops, or its spec is malformed ({exc}); recompile it"
                ) from exc
            loaded = build_kernel(lib, op_name, inputs, attrs, where)
            op_type = kernels.op_type_for(
                [i.dtype for i in inputs], [o.dtype for o in loaded.kernel.outputs]
            )
            if op_type != node.op_type:
                raise CustomOpError(
                    f"{where}: custom op {loaded.name} now builds a {op_type} kernel, but the "
                    f"executable was compiled with {node.op_type}; recompile the model"
                )
            kernels.install(spec_text, loaded, op_type)
    kernels.enable(session_options)
