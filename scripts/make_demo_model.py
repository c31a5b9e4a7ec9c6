"""Train the bundled demo model (an MLP on scikit-learn's 8x8 digits) and export it to ONNX.

Writes, next to the runtime's code (both files are committed; tests never run this script):

- ``model_runtime/demo/digits_mlp.onnx``: ``pixels`` float32 [batch, 64] (raw pixel values
  0..16, as ``load_digits`` gives them) -> ``logits`` float32 [batch, 10] and ``probabilities``
  float32 [batch, 10]; a 64-64-10 ReLU MLP, opset 17, ``batch`` a dynamic dimension.
- ``model_runtime/demo/digits_samples.npz``: held-out samples the model never trained on:
  ``pixels`` float32 [48, 64], ``labels`` int64 [48], ``logits`` float32 [48, 10] (the
  model's own outputs, from numpy), for demos and tests.

Training is plain minibatch gradient descent in numpy with fixed seeds, so a rerun gives the
same files on the same numpy. To rerun (scikit-learn is needed only here, for the dataset):

    .venv/bin/pip install scikit-learn
    .venv/bin/python scripts/make_demo_model.py

It prints the held-out accuracy and checks with onnxruntime that the ONNX graph computes what
numpy does; it exits non-zero if accuracy is below 95% or the two disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

OUT_DIR = Path(__file__).resolve().parent.parent / "model_runtime" / "demo"
ONNX_PATH = OUT_DIR / "digits_mlp.onnx"
SAMPLES_PATH = OUT_DIR / "digits_samples.npz"
HIDDEN, CLASSES, PIXEL_MAX = 64, 10, 16.0
NUM_SAMPLES = 48
Params = dict[str, np.ndarray]


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits dataset, split 75/25 into train and held-out sets (fixed seed)."""
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]
    from sklearn.model_selection import train_test_split  # type: ignore[import-untyped]

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32), y.astype(np.int64), test_size=0.25, random_state=0, stratify=y
    )
    return x_train, x_test, y_train, y_test


def forward(p: Params, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hidden activations and logits, exactly as the ONNX graph computes them."""
    h = np.maximum((pixels * np.float32(1 / PIXEL_MAX)) @ p["w1"] + p["b1"], 0)
    return h, h @ p["w2"] + p["b2"]


def train(x: np.ndarray, y: np.ndarray, epochs: int = 200, lr: float = 0.1) -> Params:
    """Minibatch gradient descent on softmax cross-entropy with a little L2."""
    rng = np.random.default_rng(0)
    p: Params = {
        "w1": (rng.standard_normal((64, HIDDEN)) * np.sqrt(2 / 64)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.standard_normal((HIDDEN, CLASSES)) * np.sqrt(2 / HIDDEN)).astype(np.float32),
        "b2": np.zeros(CLASSES, np.float32),
    }
    onehot = np.eye(CLASSES, dtype=np.float32)[y]
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for i in range(0, len(x), 32):
            idx = order[i : i + 32]
            xb = x[idx] * np.float32(1 / PIXEL_MAX)
            h, logits = forward(p, x[idx])
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            d_logits = (e / e.sum(axis=1, keepdims=True) - onehot[idx]) / len(idx)
            d_h = (d_logits @ p["w2"].T) * (h > 0)
            grads = {
                "w2": h.T @ d_logits + 1e-4 * p["w2"],
                "b2": d_logits.sum(axis=0),
                "w1": xb.T @ d_h + 1e-4 * p["w1"],
                "b1": d_h.sum(axis=0),
            }
            for k, g in grads.items():
                p[k] -= np.float32(lr) * g.astype(np.float32)
    return p


def to_onnx(p: Params) -> bytes:
    """The trained MLP as a serialized ONNX model with a dynamic ``batch`` dimension."""
    from onnx import TensorProto, checker, helper, numpy_helper

    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array(v, name) for name, v in sorted(p.items())]
    inits.append(numpy_helper.from_array(np.array(1 / PIXEL_MAX, np.float32), "scale"))
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["pixels", "scale"], ["scaled"]),
            helper.make_node("MatMul", ["scaled", "w1"], ["h1"]),
            helper.make_node("Add", ["h1", "b1"], ["h1b"]),
            helper.make_node("Relu", ["h1b"], ["h"]),
            helper.make_node("MatMul", ["h", "w2"], ["h2"]),
            helper.make_node("Add", ["h2", "b2"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        ],
        "digits_mlp",
        [helper.make_tensor_value_info("pixels", f, ["batch", 64])],
        [
            helper.make_tensor_value_info("logits", f, ["batch", CLASSES]),
            helper.make_tensor_value_info("probabilities", f, ["batch", CLASSES]),
        ],
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="model-runtime scripts/make_demo_model.py",
        doc_string="64-64-10 ReLU MLP on the sklearn 8x8 digits; pixels are raw values 0..16.",
    )
    model.ir_version = 8  # readable by every onnxruntime the runtime supports
    checker.check_model(model, full_check=True)
    data: bytes = model.SerializeToString()
    return data


def main() -> int:
    """Train, export, verify; print the held-out accuracy. Returns the exit status."""
    import onnxruntime as ort

    x_train, x_test, y_train, y_test = load_split()
    params = train(x_train, y_train)
    _, logits = forward(params, x_test)
    accuracy = float((logits.argmax(axis=1) == y_test).mean())
    print(f"held-out accuracy: {accuracy:.4f} ({len(y_test)} samples)")

    onnx_bytes = to_onnx(params)
    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    ort_logits, ort_probs = session.run(["logits", "probabilities"], {"pixels": x_test})
    max_diff = float(np.abs(ort_logits - logits).max())
    print(f"onnxruntime vs numpy: max |logits diff| = {max_diff:.2e}")
    ok = accuracy >= 0.95 and max_diff < 1e-4 and np.allclose(ort_probs.sum(axis=1), 1, atol=1e-5)

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    ONNX_PATH.write_bytes(onnx_bytes)
    np.savez_compressed(
        SAMPLES_PATH,
        pixels=x_test[:NUM_SAMPLES],
        labels=y_test[:NUM_SAMPLES],
        logits=logits[:NUM_SAMPLES].astype(np.float32),
    )
    print(f"wrote {ONNX_PATH} ({ONNX_PATH.stat().st_size} bytes)")
    print(f"wrote {SAMPLES_PATH} ({SAMPLES_PATH.stat().st_size} bytes)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
