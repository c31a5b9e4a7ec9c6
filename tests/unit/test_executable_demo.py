"""The bundled demo model is a real, accurate classifier with a dynamic batch dimension."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from model_runtime.demo import DEMO_ONNX_PATH, load_demo_samples


def test_demo_model_classifies_held_out_digits() -> None:
    pixels, labels, logits = load_demo_samples()
    assert pixels.shape == (48, 64) and pixels.dtype == np.float32 and labels.shape == (48,)
    session = ort.InferenceSession(str(DEMO_ONNX_PATH), providers=["CPUExecutionProvider"])
    for batch in (1, 7, 48):  # "batch" is dynamic
        got_logits, got_probs = session.run(["logits", "probabilities"], {"pixels": pixels[:batch]})
        np.testing.assert_allclose(got_logits, logits[:batch], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got_probs.sum(axis=1), 1.0, atol=1e-5)
    accuracy = (got_logits.argmax(axis=1) == labels).mean()
    assert accuracy >= 0.95


def test_demo_model_is_small_and_declares_its_interface() -> None:
    assert DEMO_ONNX_PATH.stat().st_size < 100_000
    model = onnx.load(str(DEMO_ONNX_PATH))
    onnx.checker.check_model(model)
    (inp,) = model.graph.input
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert (inp.name, dims) == ("pixels", ["batch", 64])
    assert [o.name for o in model.graph.output] == ["logits", "probabilities"]
