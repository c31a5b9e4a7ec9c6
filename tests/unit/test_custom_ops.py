"""Custom op libraries and the expression op, at the level of ONNX graphs and onnxruntime.

These run lowered graphs in onnxruntime directly (as the device backend does, through
``prepare_session``/``enable`` and ``raise_pending``); end-to-end runs through the compiler and
the runner are in tests/integration/test_examples_custom_ops.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from model_runtime import custom_ops
from model_runtime.custom_ops import expression, kernels
from model_runtime.errors import ConfigurationError, CustomOpError

ROTATE = "tests.custom_op_libs.rotate_op"
BROKEN = "tests.custom_op_libs.broken_ops"


@pytest.fixture(autouse=True)
def _allow_list(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(custom_ops.ALLOW_ENV, raising=False)
    custom_ops.set_allowed_libraries([ROTATE, BROKEN, "tests.custom_op_libs.no_ops"])
    yield
    custom_ops.set_allowed_libraries([])


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[str],
    outputs: list[str],
    domains: list[str],
    shape: list[int | str] | None = None,
    elem: int = TensorProto.FLOAT,
) -> onnx.ModelProto:
    dims: list[int | str] = shape or [4]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, elem, dims) for n in inputs],
        [helper.make_tensor_value_info(n, elem, None) for n in outputs],
    )
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    custom_ops.enable(so)
    session = ort.InferenceSession(
        model.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    result = session.run(None, feeds)
    custom_ops.raise_pending()
    return [np.asarray(r) for r in result]


def _rotate_model(shape: list[int | str] | None = None) -> onnx.ModelProto:
    node = helper.make_node("Rotate", ["x", "y", "angle"], ["rx", "ry"], domain=ROTATE)
    return _model([node], ["x", "y", "angle"], ["rx", "ry"], [ROTATE], shape)


def test_rotate_lowers_to_one_kernel_node_and_matches_the_seed() -> None:
    lowered, refs = custom_ops.lower(_rotate_model())
    assert [n.domain for n in lowered.graph.node] == [kernels.DOMAIN]
    assert [(r.library, r.op, r.is_hashable) for r in refs] == [(ROTATE, "Rotate", True)]
    assert len(refs[0].library_hash) == 64
    x = np.array([2, 4, 6, -1], np.float32)
    y = np.array([2, 3, 8, -1], np.float32)
    angle = np.array([np.pi, np.pi / 2, 3 * np.pi / 2, 0], np.float32)
    rx, ry = _run(lowered, {"x": x, "y": y, "angle": angle})
    np.testing.assert_allclose(rx, [-2, -3, 8, -1], atol=1e-5)
    np.testing.assert_allclose(ry, [-2, 4, -6, -1], atol=1e-5)


def test_lowered_node_stores_the_op_as_json_data() -> None:
    lowered, _ = custom_ops.lower(_rotate_model(["batch", 4]))
    (attr,) = lowered.graph.node[0].attribute
    spec = json.loads(helper.get_attribute_value(attr))
    assert spec["library"] == ROTATE and spec["op"] == "Rotate"
    assert spec["inputs"] == [[[-1, 4], "float32"]] * 3  # the batch stays open


def test_library_not_on_the_allow_list_is_not_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    custom_ops.set_allowed_libraries([])
    sys.modules.pop(ROTATE, None)
    with pytest.raises(CustomOpError, match=r"not on the allow-list.*custom_op_libraries"):
        custom_ops.lower(_rotate_model())
    assert ROTATE not in sys.modules
    monkeypatch.setenv(custom_ops.ALLOW_ENV, f"other.lib, {ROTATE}")
    custom_ops.lower(_rotate_model())  # the environment's list is honoured


def test_allow_list_rejects_names_that_are_not_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="not a Python module name"):
        custom_ops.set_allowed_libraries(["../evil.so"])
    monkeypatch.setenv(custom_ops.ALLOW_ENV, "ok.mod,/tmp/x")
    with pytest.raises(ConfigurationError, match=custom_ops.ALLOW_ENV):
        custom_ops.allowed_libraries()


@pytest.mark.parametrize(
    ("domain", "op", "message"),
    [
        ("tests.custom_op_libs.no_ops", "X", "has no OPS mapping"),
        (BROKEN, "Missing", r"declares no op 'Missing' \(it declares: Double"),
        (BROKEN, "WrongShape", r"returned float32\[5\] for output 0.*declares float32\[4\]"),
        (BROKEN, "Raises", "failed: RuntimeError: kernel exploded"),
        (BROKEN, "NotAKernel", "returned str, not a Kernel"),
    ],
)
def test_broken_libraries_fail_at_compile_time(domain: str, op: str, message: str) -> None:
    node = helper.make_node(op, ["x"], ["y"], domain=domain)
    with pytest.raises(CustomOpError, match=message):
        custom_ops.lower(_model([node], ["x"], ["y"], [domain]))


def test_kernel_error_at_run_time_is_raised_not_fatal() -> None:
    node = helper.make_node("RaisesAtRun", ["x"], ["y"], domain=BROKEN)
    lowered, _ = custom_ops.lower(_model([node], ["x"], ["y"], [BROKEN]))
    (y,) = _run(lowered, {"x": np.ones(4, np.float32)})
    np.testing.assert_array_equal(y, 2 * np.ones(4))
    with pytest.raises(CustomOpError, match="negative input"):
        _run(lowered, {"x": -np.ones(4, np.float32)})
    custom_ops.raise_pending()  # cleared: the next run starts clean


def test_unhashable_op_cannot_be_cached_and_names_the_op() -> None:
    node = helper.make_node("Unhashable", ["x"], ["y"], domain=BROKEN)
    model = _model([node], ["x"], ["y"], [BROKEN])
    with pytest.raises(CustomOpError, match=r"broken_ops:Unhashable.*cannot be pre-compiled"):
        custom_ops.check_cacheable(model, "pre-compiled")
    assert custom_ops.check_cacheable(_rotate_model(), "cached") != ""
    assert custom_ops.check_cacheable(_model([], ["x"], ["x"], []), "cached") == ""


def test_cacheability_names_unhashable_ops_without_raising() -> None:
    unhashable = helper.make_node("Unhashable", ["x"], ["y"], domain=BROKEN)
    double = helper.make_node("Double", ["y"], ["z"], domain=BROKEN)
    c = custom_ops.cacheability(_model([unhashable, double], ["x"], ["z"], [BROKEN]))
    assert not c.cacheable
    assert c.unhashable == (f"{BROKEN}:Unhashable",)  # Double is hashable: not named
    assert "cannot be cached" in c.reason("cached") and "is_hashable=True" in c.reason("cached")
    ok = custom_ops.cacheability(_rotate_model())
    assert ok.cacheable and ok.reason("cached") == ""
    assert ok.fingerprint == custom_ops.check_cacheable(_rotate_model(), "cached")


# -- the expression op --------------------------------------------------------------------------


def _expression_run(fn: Callable[..., Any], *arrays: np.ndarray) -> np.ndarray:
    names = [f"t{i}" for i in range(len(arrays))]
    node = custom_ops.codelet_expression_op(fn, *names, output="out")
    elem = helper.np_dtype_to_tensor_dtype(arrays[0].dtype)
    model = _model([node], names, ["out"], [expression.LIBRARY], list(arrays[0].shape), elem=elem)
    lowered, refs = custom_ops.lower(model, allowed=[])  # built in: needs no allow-list entry
    assert len(lowered.graph.node) == 1, "one fused kernel"
    assert refs[0].library == expression.LIBRARY and refs[0].is_hashable
    (out,) = _run(lowered, dict(zip(names, arrays, strict=True)))
    return out


def test_expression_matches_numpy_across_blocks() -> None:
    rng = np.random.default_rng(0)
    n = expression.BLOCK * 2 + 7  # a partial last block
    a, b, c = (rng.standard_normal(n).astype(np.float32) for _ in range(3))

    def my_custom_op(x: Any, y: Any, z: Any) -> Any:
        return x * x + y * z

    np.testing.assert_allclose(_expression_run(my_custom_op, a, b, c), a * a + b * c, rtol=1e-6)


def test_expression_constants_abs_neg_and_int_dtypes() -> None:
    x = np.arange(-6, 6, dtype=np.int64).reshape(3, 4)
    y = np.full((3, 4), 3, dtype=np.int64)
    got = _expression_run(lambda p, q: abs(p - 2) * 3 - -q + np.abs(p) - 1, x, y)
    np.testing.assert_array_equal(got, np.abs(x - 2) * 3 + y + np.abs(x) - 1)
    assert got.dtype == np.int64


def test_expression_tree_is_stored_as_data() -> None:
    node = custom_ops.codelet_expression_op(lambda x, y: x * 2 + y, "a", "b")
    (attr,) = node.attribute
    assert json.loads(helper.get_attribute_value(attr)) == {
        "op": "add",
        "args": [{"op": "mul", "args": [{"input": 0}, {"const": 2}]}, {"input": 1}],
    }


@pytest.mark.parametrize(
    ("fn", "named"),
    [
        (lambda x, y: x / y, "/"),
        (lambda x, y: x**2, r"\*\*"),
        (lambda x, y: x < y, "<"),
        (lambda x, y: x if x else y, "truth test"),
        (lambda x, y: np.sin(x), "numpy.sin"),
        (lambda x, y: x[0], "indexing"),
        (lambda x, y: x.sum(), r"attribute \.sum"),
        (lambda x, y: 3, "must return one expression"),
        (lambda x, y: x + "s", "str operand"),
    ],
)
def test_unsupported_operations_raise_at_trace_time(fn: Callable[..., Any], named: str) -> None:
    with pytest.raises(CustomOpError, match=named):
        custom_ops.codelet_expression_op(fn, "a", "b")


def test_expression_rejects_tampered_trees() -> None:
    info = custom_ops.TensorInfo((4,), np.dtype(np.float32))
    build = expression.OPS[expression.OP].build
    for tree in ({"op": "div", "args": []}, {"input": 5}, {"code": "import os"}):
        with pytest.raises(CustomOpError, match="expression:"):
            build([info], {"expression": json.dumps(tree)})
