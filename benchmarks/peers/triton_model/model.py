"""Triton python-backend model: the benchmark's ONNX MLP, one onnxruntime run per batch.

Runs inside Triton's python backend stub, with the Triton peer venv's packages
(``.venv-peers/triton``: onnxruntime of our version, numpy); ``ort_session.py`` is copied next to
it, so the session has the options every server of the benchmarks gets (``threads`` intra-op
threads, spinning off). Triton's dynamic batcher hands :meth:`TritonPythonModel.execute` the
requests it queued (up to ``max_batch_size`` rows in all); they are concatenated along dim 0,
run as ONE batch, and the answer is split back by rows. The config's parameters name the ONNX
file (``onnx_path``) and the thread count (``intra_op_threads``). At initialize it logs one
line, ``triton_peer_model {json}``: the stub's Python prefix and package versions, for the report.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils  # provided by the stub, not installable
from ort_session import make_session


class TritonPythonModel:
    """One onnxruntime session; its first input and first output are the model's."""

    def initialize(self, args: dict[str, str]) -> None:
        """Load the session named by the config's parameters.

        Raises:
            KeyError: the config lacks ``onnx_path``; onnxruntime's errors when the file does
                not load (Triton then marks the model unavailable and says why).
        """
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self._session = make_session(params["onnx_path"], int(params.get("intra_op_threads", 1)))
        self._input = self._session.get_inputs()[0].name
        self._output = self._session.get_outputs()[0].name
        # One line the benchmark reads back from Triton's log: which Python and packages the
        # stub really runs (the peer venv's, through PATH), and the session's threads.
        found = {
            "prefix": sys.prefix,
            "python": sys.version.split()[0],
            "onnxruntime": ort.__version__,
            "numpy": np.__version__,
            "intra_op_threads": self._session.get_session_options().intra_op_num_threads,
        }
        pb_utils.Logger.log_info("triton_peer_model " + json.dumps(found))

    def execute(self, requests: list[Any]) -> list[Any]:
        """One response per request, from one onnxruntime run over all their rows.

        A failed run answers every request of the batch with the error (Triton returns it to
        each client), rather than raising, which would fail the whole execute call.
        """
        xs = [pb_utils.get_input_tensor_by_name(r, self._input).as_numpy() for r in requests]
        try:
            batch = xs[0] if len(xs) == 1 else np.concatenate(xs)
            (y,) = self._session.run([self._output], {self._input: batch})
        except Exception as exc:  # onnxruntime's errors: each client gets the message
            error = pb_utils.TritonError(f"onnxruntime: {exc}")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        out, start = [], 0
        for x in xs:
            n = len(x)
            tensor = pb_utils.Tensor(self._output, y[start : start + n])
            out.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            start += n
        return out
