"""KServe's Python model server with the benchmark's ONNX model (runs in KServe's venv).

A ``kserve.Model`` that runs onnxruntime once per request in ``predict``, as KServe's users
write one (KServe's Python server has no request batching of its own), served by
``kserve.ModelServer`` on the v2 REST protocol, gRPC off. Binary tensors (the v2 binary data
extension) are decoded by KServe; the answer is binary when the request asks for it.

    python kserve_server.py MODEL.onnx --name mlp --port 8080 [--threads 1]
"""

from __future__ import annotations

import argparse
import logging
import uuid

from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from ort_session import make_session


class OnnxModel(Model):
    """One onnxruntime session; the request's first input is the model's first input."""

    def __init__(self, name: str, path: str, threads: int) -> None:
        super().__init__(name)
        self._path, self._threads = path, threads
        self.load()

    def load(self) -> bool:
        self._session = make_session(self._path, self._threads)
        self._input = self._session.get_inputs()[0].name
        self._outputs = [o.name for o in self._session.get_outputs()]
        self.ready = True
        return self.ready

    def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None
    ) -> InferResponse:
        x = payload.inputs[0].as_numpy()
        ys = self._session.run(self._outputs, {self._input: x})
        binary = bool((payload.parameters or {}).get("binary_data_output", False))
        outputs = []
        for name, y in zip(self._outputs, ys, strict=True):
            out = InferOutput(name=name, shape=list(y.shape), datatype="FP32")
            out.set_data_from_numpy(y, binary_data=binary)
            outputs.append(out)
        return InferResponse(
            model_name=self.name, infer_outputs=outputs, response_id=payload.id or uuid.uuid4().hex
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--name", default="mlp")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    server = ModelServer(
        http_port=args.port, enable_grpc=False, workers=1, enable_latency_logging=False
    )
    logging.getLogger("uvicorn.access").disabled = True  # no per-request logging, as the others
    server.start([OnnxModel(args.name, args.model, args.threads)])


if __name__ == "__main__":
    main()
