"""CPU per call of the gRPC message side, in process: ``ModelInferRequest`` bytes to an
:class:`~model_runtime.server.tensors.request.InferRequest` (wire parse + checks), and outputs
to ``ModelInferResponse`` bytes (by protobuf, and written directly as the unary path does),
for the demo model's request as perf_analyzer sends it (the
``triton_enable_empty_final_response`` parameter, two outputs named) and as
``tritonclient.grpc`` sends it by default (no parameters, no outputs named).

    python benchmarks/grpc_codec.py [--calls 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_runtime.server.grpc.codec import (
    encode_model_infer_response,
    parse_model_infer_request,
)
from model_runtime.server.grpc.request_plan import read_model_infer_request
from model_runtime.server.grpc.response_wire import model_infer_response_bytes
from model_runtime.server.tensors.request import InferRequest, TensorSpec
from model_runtime.server.triton import grpc_service_pb2 as pb

INPUTS = (TensorSpec("pixels", "FP32", (-1, 64)),)
OUTPUTS = (TensorSpec("logits", "FP32", (-1, 10)), TensorSpec("probabilities", "FP32", (-1, 10)))
DATATYPES = {"logits": "FP32", "probabilities": "FP32"}


def request_bytes(kind: str) -> bytes:
    """The serialized request of ``kind`` (``perf_analyzer`` or ``tritonclient``)."""
    req = pb.ModelInferRequest(model_name="digits")
    req.inputs.add(name="pixels", datatype="FP32", shape=(1, 64))
    req.raw_input_contents.append(np.random.rand(1, 64).astype(np.float32).tobytes())
    if kind == "perf_analyzer":
        req.parameters["triton_enable_empty_final_response"].bool_param = True
        req.outputs.add(name="logits")
        req.outputs.add(name="probabilities")
    data: bytes = req.SerializeToString()
    return data


def _best(fn: Callable[[], object], calls: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - t0) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results = {
        "logits": np.random.rand(1, 10).astype(np.float32),
        "probabilities": np.random.rand(1, 10).astype(np.float32),
    }
    view = memoryview
    for kind in ("perf_analyzer", "tritonclient"):
        data = view(request_bytes(kind))

        def parse(data: memoryview = data) -> InferRequest:
            req = read_model_infer_request(data)
            return parse_model_infer_request(
                req, INPUTS, OUTPUTS, model=req.model_name, regions=None
            )

        parsed = parse()

        def encode(parsed: InferRequest = parsed) -> bytes:
            response = encode_model_infer_response(
                "digits", "1", parsed, results, DATATYPES, specs=OUTPUTS
            )
            wire: bytes = response.SerializeToString()
            return wire

        def wire(parsed: InferRequest = parsed) -> bytes:
            return model_infer_response_bytes(
                "digits", "1", parsed, results, DATATYPES, specs=OUTPUTS
            )

        def unary() -> bytes:  # what a unary call costs here: parse, then its answer's bytes
            return wire(parse())

        p, e, w, u = (_best(f, args.calls, args.rounds) for f in (parse, encode, wire, unary))
        print(
            f"{kind:14s} parse {p:6.2f}  encode: protobuf {e:6.2f}, wire {w:6.2f}  "
            f"unary call {u:6.2f} (us per call)"
        )


if __name__ == "__main__":
    main()
