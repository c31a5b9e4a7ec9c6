"""``codelet_expression_op``: a Python function over ``+ - * abs`` traced into one fused kernel.

The function is called once, at trace time, on symbolic tensors; what it does to them is
recorded as a small JSON expression tree (``{"op": "add", "args": [{"input": 0}, ...]}``)
stored in the ONNX node, and later in the executable, as *data*. Anything else the function
tries (``/``, ``**``, comparisons, ``if x``, indexing, ``math.sin``, numpy functions other than
the four) raises :class:`CustomOpError` at trace time naming the operation.

The kernel (this module is the runtime's built-in, always-allowed custom op library) interprets
the tree as a register program over blocks of :data:`BLOCK` elements: one kernel launch per
node, intermediates only block-sized (never whole-array), the result written in place.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import onnx
from onnx import helper

from model_runtime.custom_ops.api import CustomOp, Kernel
from model_runtime.errors import CustomOpError
from model_runtime.executable.model import TensorInfo

__all__ = ["BLOCK", "LIBRARY", "OP", "OPS", "OPSET", "codelet_expression_op", "trace"]

LIBRARY = "model_runtime.custom_ops.expression"
OP = "Expression"
#: The opset import a model with expression nodes needs.
OPSET = helper.make_opsetid(LIBRARY, 1)
#: Elements per block: intermediates stay in cache, not in whole arrays.
BLOCK = 16384

_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply}
_UNARY = {"neg": np.negative, "abs": np.absolute}
_UFUNCS = {np.add: "add", np.subtract: "sub", np.multiply: "mul", np.negative: "neg"}
_UFUNCS[np.absolute] = "abs"
Tree = dict[str, Any]


def _unsupported(what: str) -> NoReturn:
    raise CustomOpError(
        f"codelet_expression_op: the expression uses {what}, which is not supported; "
        "only +, -, *, abs() and numeric constants are"
    )


def _const(value: object) -> Tree:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        _unsupported(f"a {type(value).__name__} operand ({value!r})")
    number = float(value) if isinstance(value, float | np.floating) else int(value)
    if not math.isfinite(number):
        _unsupported(f"the non-finite constant {number!r}")
    return {"const": number}


class _Symbol:
    """A symbolic tensor during tracing."""

    __slots__ = ("tree",)

    def __init__(self, tree: Tree) -> None:
        self.tree = tree

    @staticmethod
    def _tree(value: object) -> Tree:
        return value.tree if isinstance(value, _Symbol) else _const(value)

    def _bin(self, op: str, a: object, b: object) -> _Symbol:
        return _Symbol({"op": op, "args": [self._tree(a), self._tree(b)]})

    def __add__(self, o: object) -> _Symbol:
        return self._bin("add", self, o)

    def __radd__(self, o: object) -> _Symbol:
        return self._bin("add", o, self)

    def __sub__(self, o: object) -> _Symbol:
        return self._bin("sub", self, o)

    def __rsub__(self, o: object) -> _Symbol:
        return self._bin("sub", o, self)

    def __mul__(self, o: object) -> _Symbol:
        return self._bin("mul", self, o)

    def __rmul__(self, o: object) -> _Symbol:
        return self._bin("mul", o, self)

    def __neg__(self) -> _Symbol:
        return _Symbol({"op": "neg", "args": [self.tree]})

    def __pos__(self) -> _Symbol:
        return self

    def __abs__(self) -> _Symbol:
        return _Symbol({"op": "abs", "args": [self.tree]})

    def __array_ufunc__(self, ufunc: Any, method: str, *args: Any, **kwargs: Any) -> _Symbol:
        op = _UFUNCS.get(ufunc)
        if op is None or method != "__call__" or kwargs:
            _unsupported(f"numpy.{getattr(ufunc, '__name__', ufunc)}")
        return _Symbol({"op": op, "args": [self._tree(a) for a in args]})

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> NoReturn:
        _unsupported(f"numpy.{getattr(func, '__name__', func)}")

    def __bool__(self) -> NoReturn:
        _unsupported("a truth test (if / and / or / not)")

    def __float__(self) -> NoReturn:
        _unsupported("float() (math functions convert to float)")

    def __int__(self) -> NoReturn:
        _unsupported("int()")

    def __index__(self) -> NoReturn:
        _unsupported("use as an index")

    def __getitem__(self, key: object) -> NoReturn:
        _unsupported("indexing")

    def __iter__(self) -> NoReturn:
        _unsupported("iteration")

    def __call__(self, *args: object) -> NoReturn:
        _unsupported("a call of a tensor")

    def __getattr__(self, name: str) -> NoReturn:
        _unsupported(f"the attribute .{name}")

    __hash__ = None  # type: ignore[assignment]


def _unsupported_binary(symbol: str) -> Callable[..., NoReturn]:
    def method(self: _Symbol, *args: object) -> NoReturn:
        _unsupported(f"the operator {symbol}")

    return method


for _name, _symbol in {
    "truediv": "/",
    "floordiv": "//",
    "mod": "%",
    "pow": "**",
    "matmul": "@",
    "and": "&",
    "or": "|",
    "xor": "^",
    "lshift": "<<",
    "rshift": ">>",
    "divmod": "divmod()",
}.items():
    setattr(_Symbol, f"__{_name}__", _unsupported_binary(_symbol))
    setattr(_Symbol, f"__r{_name}__", _unsupported_binary(_symbol))
_COMPARISONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
for _name, _symbol in _COMPARISONS.items():
    setattr(_Symbol, f"__{_name}__", _unsupported_binary(f"comparison {_symbol}"))
setattr(_Symbol, "__invert__", _unsupported_binary("~"))  # noqa: B010
setattr(_Symbol, "__round__", _unsupported_binary("round()"))  # noqa: B010


def trace(fn: Callable[..., Any], num_inputs: int) -> Tree:
    """Trace ``fn`` over ``num_inputs`` symbolic tensors into an expression tree.

    Raises:
        CustomOpError: ``fn`` uses an unsupported operation (named), raises, or does not
            return one expression of its inputs.
    """
    try:
        result = fn(*(_Symbol({"input": i}) for i in range(num_inputs)))
    except CustomOpError:
        raise
    except Exception as exc:
        raise CustomOpError(
            f"codelet_expression_op: tracing {getattr(fn, '__name__', fn)!r} with {num_inputs} "
            f"tensor(s) raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(result, _Symbol):
        raise CustomOpError(
            "codelet_expression_op: the function must return one expression of its inputs, "
            f"got {type(result).__name__}"
        )
    return result.tree


def codelet_expression_op(
    fn: Callable[..., Any],
    *tensors: str | onnx.ValueInfoProto,
    output: str | None = None,
    name: str | None = None,
) -> onnx.NodeProto:
    """An ONNX node computing ``fn(*tensors)`` elementwise as one fused kernel (seed 002).

    ``tensors`` are the names (or value infos) of same-shape, same-dtype tensors of the graph;
    the node's output is ``output`` (default ``<fn name>_out``). Add :data:`OPSET` to the
    model's opset imports.

    Raises:
        CustomOpError: no tensors, or as :func:`trace`.
    """
    if not tensors:
        raise CustomOpError("codelet_expression_op: give at least one tensor")
    names = [t if isinstance(t, str) else t.name for t in tensors]
    tree = trace(fn, len(names))
    label = getattr(fn, "__name__", "expression").replace("<lambda>", "expression")
    return helper.make_node(
        OP,
        names,
        [output or f"{label}_out"],
        name=name or label,
        domain=LIBRARY,
        expression=json.dumps(tree, sort_keys=True, separators=(",", ":")),
    )


# -- the kernel ---------------------------------------------------------------------------------

#: One instruction: (ufunc, destination register (-1: output), operands). An operand is
#: ("in", index), ("reg", index) or ("const", value).
_Instr = tuple[Any, int, tuple[tuple[str, Any], ...]]


def _compile(tree: Tree, num_inputs: int, dtype: np.dtype[Any]) -> tuple[list[_Instr], int, Any]:
    program: list[_Instr] = []
    free: list[int] = []
    count = 0

    def visit(node: Any, depth: int) -> tuple[str, Any]:
        nonlocal count
        if depth > 256:
            raise CustomOpError("expression: the tree is deeper than 256 levels")
        if not isinstance(node, dict):
            raise CustomOpError(f"expression: malformed node {node!r}")
        if set(node) == {"input"}:
            i = node["input"]
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_inputs:
                raise CustomOpError(f"expression: input index {i!r} out of range")
            return ("in", i)
        if set(node) == {"const"}:
            c = node["const"]
            if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c):
                raise CustomOpError(f"expression: bad constant {c!r}")
            if dtype.kind in "iu" and float(c) != int(c):
                raise CustomOpError(
                    f"expression: constant {c!r} is not an integer but the tensors are "
                    f"{dtype.name}; cast the inputs to a float type first"
                )
            return ("const", dtype.type(c))
        op, args = node.get("op"), node.get("args")
        ufunc = _BINARY.get(op) or _UNARY.get(op)  # type: ignore[arg-type]
        arity = 2 if op in _BINARY else 1
        if ufunc is None or set(node) != {"op", "args"} or not isinstance(args, list):
            raise CustomOpError(f"expression: unknown operation {op!r}")
        if len(args) != arity:
            raise CustomOpError(f"expression: {op} takes {arity} operand(s), got {len(args)}")
        operands = tuple(visit(a, depth + 1) for a in args)
        for kind, value in operands:
            if kind == "reg":
                free.append(value)
        if free:
            dst = free.pop()
        else:
            dst, count = count, count + 1
        program.append((ufunc, dst, operands))
        return ("reg", dst)

    root = visit(tree, 0)
    if root[0] == "reg":
        ufunc, _, operands = program[-1]
        program[-1] = (ufunc, -1, operands)  # the last instruction writes the output block
    return program, count, root


def _kernel(tree: Tree, info: TensorInfo, num_inputs: int) -> Callable[..., np.ndarray]:
    dtype = info.dtype
    program, num_regs, root = _compile(tree, num_inputs, dtype)

    def compute(*inputs: np.ndarray) -> np.ndarray:
        out = np.empty(inputs[0].shape, dtype=dtype)
        flat_out = out.reshape(-1)
        flat_in = [np.ascontiguousarray(x).reshape(-1) for x in inputs]
        if root[0] != "reg":  # the expression is an input or a constant
            flat_out[...] = flat_in[root[1]] if root[0] == "in" else root[1]
            return out
        n = flat_out.size
        regs = [np.empty(min(BLOCK, n), dtype=dtype) for _ in range(num_regs)]
        for start in range(0, n, BLOCK):
            stop = min(start + BLOCK, n)
            m = stop - start
            for ufunc, dst, operands in program:
                args = [
                    flat_in[v][start:stop] if k == "in" else regs[v][:m] if k == "reg" else v
                    for k, v in operands
                ]
                ufunc(*args, out=flat_out[start:stop] if dst < 0 else regs[dst][:m])
        return out

    return compute


def _build(inputs: Sequence[TensorInfo], attributes: Mapping[str, Any]) -> Kernel:
    text = attributes.get("expression")
    if not isinstance(text, str):
        raise CustomOpError("expression: the node has no 'expression' attribute")
    try:
        tree = json.loads(text)
    except ValueError as exc:
        raise CustomOpError(f"expression: the 'expression' attribute is not JSON: {exc}") from exc
    dtypes = {i.dtype for i in inputs}
    if len(dtypes) != 1:
        raise CustomOpError(
            f"expression: inputs have dtypes {sorted(d.name for d in dtypes)}; "
            "cast them to one dtype first"
        )
    if inputs[0].dtype.kind not in "fiu":
        raise CustomOpError(f"expression: dtype {inputs[0].dtype.name} is not numeric")
    return Kernel(outputs=(inputs[0],), compute=_kernel(tree, inputs[0], len(inputs)))


OPS = {OP: CustomOp(build=_build, is_elementwise=True, is_hashable=True, is_stateless=True)}
