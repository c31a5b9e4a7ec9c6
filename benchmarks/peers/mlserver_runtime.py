"""MLServer custom runtime: the benchmark's ONNX model on onnxruntime (runs in MLServer's venv).

``model-settings.json`` names ``mlserver_runtime.OnnxModel`` as the implementation, the model
file as ``parameters.uri`` and ``parameters.extra.threads``. MLServer's adaptive batching
(``max_batch_size``/``max_batch_time`` in the same file) merges single-sample requests into one
request along dim 0 before ``predict`` and splits the answer after it: the model sees batches.
"""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from ort_session import make_session


class OnnxModel(MLModel):
    """One onnxruntime session; the request's first input is the model's first input."""

    async def load(self) -> bool:
        params = self.settings.parameters
        extra = (params.extra if params else None) or {}
        self._session = make_session(
            str(params.uri if params else ""), int(extra.get("threads", 1))
        )
        self._input = self._session.get_inputs()[0].name
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        ys = self._session.run(self._outputs, {self._input: x})
        return InferenceResponse(
            model_name=self.name,
            outputs=[
                NumpyCodec.encode_output(n, y) for n, y in zip(self._outputs, ys, strict=True)
            ],
        )
