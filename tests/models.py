"""Builders of small ONNX test models (shared by unit, integration and benchmark tests).

Every builder is deterministic: weights come from a seeded generator. Models use opset 13 and
IR version 8 so any onnxruntime >= 1.14 loads them.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "LIGHT_MODELS",
    "ONNX_TEST_DATA",
    "OPSET",
    "light_model",
    "make_accumulator",
    "make_add_double",
    "make_batch_mixing",
    "make_counter",
    "make_dynamic_feature",
    "make_embedding",
    "make_fixed_batch_reshape",
    "make_mlp",
    "make_no_batch",
    "make_simple",
    "make_simple_sequence",
    "make_simple_string",
    "make_string_identity",
    "make_string_mixed",
    "save",
]

OPSET = 13

#: The test data the onnx wheel ships (light models, backend test cases).
ONNX_TEST_DATA = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data"

Dim = int | str


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tests.models"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    """Write ``model`` to ``path`` and return the path."""
    onnx.save_model(model, str(path))
    return path


def make_mlp(
    batch: Dim = "N", sizes: tuple[int, ...] = (784, 512, 512, 10), seed: int = 0
) -> onnx.ModelProto:
    """An MLP (default 784-512-512-10): MatMul+Add+Relu layers, logits out.

    Input ``x`` [batch, 784] float32, output ``logits`` [batch, 10]. Weights are random
    (seeded), so a wrong weight binding changes the answer.
    """
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    prev = "x"
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        b = (rng.standard_normal(fan_out) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(sizes) - 2
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"]))
        out = "logits" if last else f"h{i}"
        nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [out if last else f"a{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, sizes[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, sizes[-1]])],
        inits,
    )
    return _model(graph)


def make_embedding(
    batch: Dim = "N", rows: int = 100, width: int = 8, seed: int = 0
) -> onnx.ModelProto:
    """An embedding lookup: ``ids`` int64 [batch] -> ``vectors`` float32 [batch, width].

    The table has ``rows`` rows, so an id outside ``[-rows, rows)`` makes onnxruntime's Gather
    fail with INVALID_ARGUMENT: one caller's bad data in a batch of good ones.
    """
    table = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["vectors"], axis=0)],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [batch])],
        [helper.make_tensor_value_info("vectors", TensorProto.FLOAT, [batch, width])],
        [numpy_helper.from_array(table, "table")],
    )
    return _model(graph)


def make_add_double(batch: Dim = "N", width: int = 4) -> onnx.ModelProto:
    """``sum = x + bias`` and ``double = x + x``; ``bias`` is ``[1, 2, ..., width]``."""
    bias = np.arange(1, width + 1, dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "bias"], ["sum"]),
            helper.make_node("Add", ["x", "x"], ["double"]),
        ],
        "add_double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, [batch, width]),
            helper.make_tensor_value_info("double", TensorProto.FLOAT, [batch, width]),
        ],
        [numpy_helper.from_array(bias, "bias")],
    )
    return _model(graph)


def make_counter(batch: Dim = "N", width: int = 4) -> onnx.ModelProto:
    """A stateful model: ``y = x + count``; ``count_next = count + 1``.

    Compile with ``variables=("count",)`` and ``variable_updates={"count_next": "count"}``:
    the n-th run (from 0) adds n to every element.
    """
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "count"], ["y"]),
            helper.make_node("Add", ["count", "one"], ["count_next"]),
        ],
        "counter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width]),
            helper.make_tensor_value_info("count_next", TensorProto.FLOAT, [1]),
        ],
        [
            numpy_helper.from_array(np.zeros(1, np.float32), "count"),
            numpy_helper.from_array(np.ones(1, np.float32), "one"),
        ],
    )
    return _model(graph)


def make_fixed_batch_reshape(channels: int = 3, side: int = 4) -> onnx.ModelProto:
    """A model exported at batch 1 whose ``Reshape`` constant holds the 1.

    ``x`` [1, C, S, S] -> Relu -> Reshape to [1, C*S*S] (constant) -> MatMul -> ``y`` [1, 5].
    """
    rng = np.random.default_rng(1)
    flat = channels * side * side
    w = rng.standard_normal((flat, 5)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Reshape", ["r", "flat_shape"], ["f"]),
            helper.make_node("MatMul", ["f", "w"], ["y"]),
        ],
        "fixed_batch_reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [
            numpy_helper.from_array(np.array([1, flat], np.int64), "flat_shape"),
            numpy_helper.from_array(w, "w"),
        ],
    )
    return _model(graph)


def make_batch_mixing(width: int = 4) -> onnx.ModelProto:
    """A batch-1 model whose result depends on the whole batch: ``y = x - mean(x, axis=0)``.

    Re-batching it changes every row's answer, so the compiler must refuse.
    """
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
            helper.make_node("Sub", ["x", "m"], ["y"]),
        ],
        "batch_mixing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
    )
    return _model(graph)


def make_dynamic_feature() -> onnx.ModelProto:
    """A model with a dynamic non-batch dim: ``x`` [N, "seq"] -> Relu -> ``y``."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "dynamic_feature",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "seq"])],
    )
    return _model(graph)


def make_text_classifier(
    vocab: int = 100, width: int = 16, classes: int = 4, seed: int = 0, layers: int = 0
) -> onnx.ModelProto:
    """A text classifier whose sequence axis varies per request: ``ids`` INT64
    ["batch", "seq"] -> embedding (Gather) -> ``layers`` transformer encoder blocks (one-head
    self-attention over ``seq`` and a feed-forward layer of 4 x ``width``, each with a residual
    and LayerNormalization) -> mean over ``seq`` -> linear -> ``logits`` [batch, classes]; also
    ``hidden`` [batch, seq, width], the token states (an output whose shape follows the
    request's). ``layers=0``: the embedding alone, a model too cheap for batching to pay."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {
        "emb": rng.standard_normal((vocab, width)).astype(np.float32),
        "w": rng.standard_normal((width, classes)).astype(np.float32),
        "b": rng.standard_normal((classes,)).astype(np.float32),
    }
    if layers:
        tensors["ones"] = np.ones(width, np.float32)
        tensors["zeros"] = np.zeros(width, np.float32)
        tensors["scale"] = np.array(1 / np.sqrt(width), np.float32)

    def dense(name: str, rows: int, cols: int) -> str:
        tensors[name] = (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)
        return name

    node = helper.make_node
    state = "hidden" if layers == 0 else "x0"
    nodes = [node("Gather", ["emb", "ids"], [state])]
    for i in range(layers):
        p = f"l{i}_"
        out = "hidden" if i == layers - 1 else f"x{i + 1}"
        ffn = 4 * width
        nodes += [
            node("MatMul", [state, dense(p + "wq", width, width)], [p + "q"]),
            node("MatMul", [state, dense(p + "wk", width, width)], [p + "k"]),
            node("MatMul", [state, dense(p + "wv", width, width)], [p + "v"]),
            node("Transpose", [p + "k"], [p + "kt"], perm=[0, 2, 1]),
            node("MatMul", [p + "q", p + "kt"], [p + "qk"]),
            node("Mul", [p + "qk", "scale"], [p + "scores"]),
            node("Softmax", [p + "scores"], [p + "attn"], axis=-1),
            node("MatMul", [p + "attn", p + "v"], [p + "ctx"]),
            node("MatMul", [p + "ctx", dense(p + "wo", width, width)], [p + "o"]),
            node("Add", [state, p + "o"], [p + "r1"]),
            node("LayerNormalization", [p + "r1", "ones", "zeros"], [p + "n1"], axis=-1),
            node("MatMul", [p + "n1", dense(p + "w1", width, ffn)], [p + "f1"]),
            node("Relu", [p + "f1"], [p + "a1"]),
            node("MatMul", [p + "a1", dense(p + "w2", ffn, width)], [p + "f2"]),
            node("Add", [p + "n1", p + "f2"], [p + "r2"]),
            node("LayerNormalization", [p + "r2", "ones", "zeros"], [out], axis=-1),
        ]
        state = out
    nodes += [
        node("ReduceMean", ["hidden"], ["mean"], axes=[1], keepdims=0),
        node("MatMul", ["mean", "w"], ["mw"]),
        node("Add", ["mw", "b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "text_classifier",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes]),
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", width]),
        ],
        [numpy_helper.from_array(v, k) for k, v in tensors.items()],
    )
    if not layers:
        return _model(graph)
    model = helper.make_model(  # LayerNormalization is opset 17
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests.models"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def make_string_identity(batch: Dim = "N", width: int = 1) -> onnx.ModelProto:
    """Triton's ``simple_identity``: ``INPUT0`` STRING [batch, width] -> Identity ->
    ``OUTPUT0`` STRING [batch, width]."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "string_identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, [batch, width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, [batch, width])],
    )
    return _model(graph)


def make_string_mixed(batch: Dim = "N", width: int = 2) -> onnx.ModelProto:
    """Strings beside numbers: ``text`` STRING [batch, width] and ``x`` FLOAT [batch, 4] in;
    ``echo`` (``text``), ``is_yes`` (``text == "yes"``, a string constant of the graph) and
    ``double`` (``x + x``) out."""
    yes = helper.make_tensor("yes", TensorProto.STRING, [1], [b"yes"])
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["text"], ["echo"]),
            helper.make_node("Equal", ["text", "yes"], ["is_yes"]),
            helper.make_node("Add", ["x", "x"], ["double"]),
        ],
        "string_mixed",
        [
            helper.make_tensor_value_info("text", TensorProto.STRING, [batch, width]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4]),
        ],
        [
            helper.make_tensor_value_info("echo", TensorProto.STRING, [batch, width]),
            helper.make_tensor_value_info("is_yes", TensorProto.BOOL, [batch, width]),
            helper.make_tensor_value_info("double", TensorProto.FLOAT, [batch, 4]),
        ],
        [yes],
    )
    model = helper.make_model(  # Equal on strings needs opset 19
        graph, opset_imports=[helper.make_opsetid("", 19)], producer_name="tests.models"
    )
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def make_no_batch(shape: tuple[int, ...] = (3, 4, 4)) -> onnx.ModelProto:
    """A model without a batch axis (Triton's ``max_batch_size: 0``): ``x`` FLOAT ``shape``
    -> ``y = x - mean(x)`` over the whole tensor, so splitting or combining inputs along any
    axis would change the answer."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["x"], ["m"], keepdims=1),
            helper.make_node("Sub", ["x", "m"], ["y"]),
        ],
        "no_batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    return _model(graph)


LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def light_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """A "light" model from the onnx wheel, with random (seeded) weights instead of constants.

    The wheel's light models generate every weight with ``ConstantOfShape`` (all 0.02), which
    makes every class score equal whatever the input: useless for checking outputs. Each such
    node becomes an initializer: rank >= 2 tensors (conv/fc weights) ~ N(0, 1/fan_in), vectors
    (biases, batch-norm parameters) ~ U(0.5, 1.5) so variances stay positive. The input of
    the last ``Softmax`` (the logits) becomes a second graph output.
    """
    model = onnx.load(str(ONNX_TEST_DATA / "light" / f"light_{name}.onnx"))
    rng = np.random.default_rng(seed)
    graph = model.graph
    shapes = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            shape = tuple(int(d) for d in shapes[node.input[0]])
            if len(shape) >= 2:
                fan_in = int(np.prod(shape[1:]))
                value = rng.standard_normal(shape) / np.sqrt(fan_in)
            else:
                value = rng.uniform(0.5, 1.5, size=shape)
            graph.initializer.append(
                numpy_helper.from_array(value.astype(np.float32), node.output[0])
            )
            if model.ir_version < 4 and node.output[0] not in {i.name for i in graph.input}:
                # IR 3 wants every initializer listed among the graph inputs.
                graph.input.append(
                    helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, shape)
                )
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    softmax = [n for n in graph.node if n.op_type == "Softmax"]
    if softmax:
        # Probabilities saturate to one-hot with random weights; the logits keep rows apart.
        logits = softmax[-1].input[0]
        inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
        graph.output.extend(vi for vi in inferred if vi.name == logits)
    onnx.checker.check_model(model)
    return model


def make_simple(dtype: int = TensorProto.INT32, width: int = 16) -> onnx.ModelProto:
    """Triton's ``simple``: ``INPUT0``, ``INPUT1`` [batch, width] of ``dtype`` (INT32; INT8
    for ``simple_int8``) -> ``OUTPUT0 = INPUT0 + INPUT1``, ``OUTPUT1 = INPUT0 - INPUT1``.
    Types other than INT32 are computed in int32 (``Cast``: onnxruntime has no int8 ``Add``)
    and wrap around as Triton's int8 model does."""
    nodes = []
    a, b, total, diff = "INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1"
    if dtype != TensorProto.INT32:
        a, b, total, diff = "a", "b", "sum", "diff"
        nodes += [
            helper.make_node("Cast", ["INPUT0"], [a], to=TensorProto.INT32),
            helper.make_node("Cast", ["INPUT1"], [b], to=TensorProto.INT32),
        ]
    nodes += [helper.make_node("Add", [a, b], [total]), helper.make_node("Sub", [a, b], [diff])]
    if dtype != TensorProto.INT32:
        nodes += [
            helper.make_node("Cast", [total], ["OUTPUT0"], to=dtype),
            helper.make_node("Cast", [diff], ["OUTPUT1"], to=dtype),
        ]
    graph = helper.make_graph(
        nodes,
        "simple",
        [helper.make_tensor_value_info(n, dtype, ["N", width]) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, dtype, ["N", width]) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return _model(graph)


def make_simple_string(width: int = 16) -> onnx.ModelProto:
    """Triton's ``simple_string``: ``simple`` on numbers written as strings. ``INPUT0``,
    ``INPUT1`` STRING [batch, width] (decimal integers) -> ``OUTPUT0`` (sum) and ``OUTPUT1``
    (difference), STRING; ONNX ``Cast`` converts between strings and int32.

    An empty string reads as 0: the rows that pad a partial batch are ``b""``, which ``Cast``
    cannot parse (onnxruntime fails the whole batch), so the graph maps them to ``"0"`` first.
    """
    zero = helper.make_tensor("zero", TensorProto.STRING, [], [b"0"])
    empty = helper.make_tensor("empty", TensorProto.STRING, [], [b""])
    nodes = []
    for name, parsed in (("INPUT0", "a"), ("INPUT1", "b")):
        nodes += [
            helper.make_node("Equal", [name, "empty"], [f"{parsed}_empty"]),
            helper.make_node("Where", [f"{parsed}_empty", "zero", name], [f"{parsed}_text"]),
            helper.make_node("Cast", [f"{parsed}_text"], [parsed], to=TensorProto.INT32),
        ]
    nodes += [
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["diff"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
        helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=TensorProto.STRING),
    ]
    graph = helper.make_graph(
        nodes,
        "simple_string",
        [
            helper.make_tensor_value_info(n, TensorProto.STRING, ["N", width])
            for n in ("INPUT0", "INPUT1")
        ],
        [
            helper.make_tensor_value_info(n, TensorProto.STRING, ["N", width])
            for n in ("OUTPUT0", "OUTPUT1")
        ],
        [zero, empty],
    )
    model = helper.make_model(  # Equal on strings needs opset 19
        graph, opset_imports=[helper.make_opsetid("", 19)], producer_name="tests.models"
    )
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def make_accumulator(corrid: bool = False) -> onnx.ModelProto:
    """The demo's stateful accumulator (:func:`model_runtime.demo.accumulator_model`)."""
    from model_runtime.demo import accumulator_model

    return accumulator_model(corrid=corrid)


def make_simple_sequence() -> onnx.ModelProto:
    """Triton's ``simple_sequence`` example model as NVIDIA's sequence clients expect it:
    ``OUTPUT = (INPUT + START) * READY``, int32 ``[N, 1]`` (the first step adds 1)."""
    i32 = TensorProto.INT32
    vi = [helper.make_tensor_value_info(n, i32, ["N", 1]) for n in ("INPUT", "START", "READY")]
    nodes = [
        helper.make_node("Add", ["INPUT", "START"], ["sum"]),
        helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"]),
    ]
    out = [helper.make_tensor_value_info("OUTPUT", i32, ["N", 1])]
    return _model(helper.make_graph(nodes, "simple_sequence", vi, out))


def make_add_sub(width: int = 4) -> onnx.ModelProto:
    """An FP32 ``add_sub`` without a batch axis, as NVIDIA's python backend examples' torch
    model: ``INPUT0``, ``INPUT1`` [width] -> ``OUTPUT0 = INPUT0 + INPUT1``, ``OUTPUT1 =
    INPUT0 - INPUT1`` (a BLS target of another model kind)."""
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        [helper.make_tensor_value_info(n, f, [width]) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, f, [width]) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return _model(graph)
