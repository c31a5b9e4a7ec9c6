"""Python models (``model.py`` sources) for the python backend's tests, and a writer that lays
them out as Triton's repository does (``NAME/config.pbtxt`` is not needed: configs are dicts).

``add_sub`` is written after NVIDIA's example of that name (same inputs, outputs and arithmetic);
none of NVIDIA's code is kept here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["MODELS", "config", "write_model"]

ADD_SUB = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        config = json.loads(args["model_config"])
        self.out0 = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"])
        self.out1 = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT1")["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if a.size and float(a.reshape(-1)[0]) == -13.0:
                import os
                os._exit(3)  # a poison input: the instance dies on it
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.out0)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.out1)),
            ], parameters={"batch": len(requests)}))
        return responses
"""

RAISES = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        if x.reshape(-1)[0] < 0:
            raise ValueError("negative input")
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x.reshape(-1)[0] == 7:
                error = pb_utils.TritonError("seven is refused", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            elif x.reshape(-1)[0] == 8:
                responses.append("not a response")
            elif x.reshape(-1)[0] == 9:
                responses.append(pb_utils.InferenceResponse([x]))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return responses
"""

WRONG_COUNT = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return []
"""

EXITS = """
import os
import time


class TritonPythonModel:
    def execute(self, requests):
        os._exit(3)
"""

BROKEN_IMPORT = """
import triton_python_backend_utils as pb_utils
import a_module_that_does_not_exist
"""

INIT_RAISES = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise pb_utils.TritonModelException("the weights are missing")

    def execute(self, requests):
        return []
"""

ASYNC = """
import asyncio
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.running = 0
        self.peak = 0

    async def execute(self, requests):
        self.running += 1
        self.peak = max(self.peak, self.running)
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        await asyncio.sleep(float(x.reshape(-1)[0]))
        self.running -= 1
        peak = pb_utils.Tensor("PEAK", __import__("numpy").array([self.peak], "int32"))
        return [pb_utils.InferenceResponse([peak]) for _ in requests]
"""

# After NVIDIA's decoupled "repeat" example: one response per element of IN, sent from a thread
# of the model's own, then the final flag; execute returns at once.
REPEAT = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            threading.Thread(target=self.respond, args=(sender, values), daemon=True).start()
        return None

    def respond(self, sender, values):
        for i, v in enumerate(values.reshape(-1)):
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([v], np.int32)),
                pb_utils.Tensor("IDX", np.array([i], np.uint32)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# BLS: calls the model named by the request's parameter "target" (sync exec, or async_exec when
# the parameter "async" is true), and returns what it got, or its error.
BLS = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            call = pb_utils.InferenceRequest(
                model_name=params["target"],
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")])
            if params.get("async"):
                answer = await call.async_exec()
            else:
                answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")
                responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""

BLS_SYNC = BLS.replace("async def execute", "def execute").replace(
    "answer = await call.async_exec()", "answer = call.exec()"
)

# BLS of a decoupled model: sums what the "repeat" model streams back.
BLS_DECOUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="repeat", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", values)])
            total, count = 0, 0
            for answer in call.exec(decoupled=True):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                out = pb_utils.get_output_tensor_by_name(answer, "OUT")
                if out is not None:
                    total += int(out.as_numpy()[0])
                    count += 1
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([total], np.int64)),
                pb_utils.Tensor("COUNT", np.array([count], np.int64))]))
        return responses
"""

# Custom metrics, the logger, is_ready, finalize, the model loading API and the args.
LIFECYCLE = """
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.family = pb_utils.MetricFamily(
            name="requests_seen", description="requests the model saw",
            kind=pb_utils.MetricFamily.COUNTER)
        self.metric = self.family.Metric(labels={"model": args["model_name"]})
        self.ready_file = os.path.join(args["model_repository"], "not_ready")
        pb_utils.Logger.log_info("initialized")

    def is_ready(self):
        return not os.path.exists(self.ready_file)

    def execute(self, requests):
        responses = []
        for request in requests:
            self.metric.increment(1)
            what = json.loads(request.parameters()).get("what", "args")
            if what == "args":
                text = json.dumps(self.args)
            elif what == "metric":
                text = str(self.metric.value())
            elif what == "ready":
                text = str(pb_utils.is_model_ready("other", "1"))
            elif what == "strings":
                words = pb_utils.get_input_tensor_by_name(request, "WORDS").as_numpy()
                text = "|".join(w.decode() for w in words.reshape(-1))
            else:
                text = json.dumps({"id": request.request_id(), "corr": request.correlation_id(),
                                   "flags": request.flags(),
                                   "outputs": request.requested_output_names()})
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TEXT", np.array([text.encode()], dtype=object))]))
        return responses

    def finalize(self):
        with open(os.path.join(self.args["model_repository"], "finalized"), "w") as f:
            f.write("yes")
"""

AUTO_COMPLETE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.set_max_batch_size(8)
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

MODELS = {
    "add_sub": ADD_SUB,
    "raises": RAISES,
    "wrong_count": WRONG_COUNT,
    "exits": EXITS,
    "broken_import": BROKEN_IMPORT,
    "init_raises": INIT_RAISES,
    "async": ASYNC,
    "repeat": REPEAT,
    "bls": BLS,
    "bls_sync": BLS_SYNC,
    "bls_decoupled": BLS_DECOUPLED,
    "lifecycle": LIFECYCLE,
    "auto_complete": AUTO_COMPLETE,
}


def _tensor(name: str, dtype: str, dims: list[int]) -> dict[str, Any]:
    return {"name": name, "data_type": dtype, "dims": dims}


def config(name: str, *, max_batch_size: int = 0, instances: int = 1) -> dict[str, Any]:
    """The config (Triton's JSON form) each test model is served with."""
    fp = "TYPE_FP32"
    io: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
        "add_sub": (
            [_tensor("INPUT0", fp, [4]), _tensor("INPUT1", fp, [4])],
            [_tensor("OUTPUT0", fp, [4]), _tensor("OUTPUT1", fp, [4])],
        ),
        "repeat": (
            [_tensor("IN", "TYPE_INT32", [-1])],
            [_tensor("OUT", "TYPE_INT32", [1]), _tensor("IDX", "TYPE_UINT32", [1])],
        ),
        "bls_decoupled": (
            [_tensor("IN", "TYPE_INT32", [-1])],
            [_tensor("SUM", "TYPE_INT64", [1]), _tensor("COUNT", "TYPE_INT64", [1])],
        ),
        "lifecycle": (
            [_tensor("WORDS", "TYPE_STRING", [-1])],
            [_tensor("TEXT", "TYPE_STRING", [1])],
        ),
        "async": ([_tensor("INPUT0", fp, [1])], [_tensor("PEAK", "TYPE_INT32", [1])]),
        "bls_onnx": ([_tensor("INPUT0", fp, [4])], [_tensor("OUTPUT0", fp, [4])]),
    }
    inputs, outputs = io.get(name, ([_tensor("INPUT0", fp, [-1])], [_tensor("OUTPUT0", fp, [-1])]))
    if name.startswith("bls") and name not in ("bls_decoupled", "bls_onnx"):
        inputs, outputs = io["add_sub"][0], [_tensor("OUTPUT0", fp, [4])]
    out: dict[str, Any] = {
        "name": name,
        "backend": "python",
        "max_batch_size": max_batch_size,
        "input": inputs,
        "output": outputs,
        "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
    }
    if name == "repeat":
        out["model_transaction_policy"] = {"decoupled": True}
    if max_batch_size:
        out["dynamic_batching"] = {}
    return out


def write_model(repository: Path, name: str, version: int = 1, source: str | None = None) -> Path:
    """Write ``REPOSITORY/NAME/VERSION/model.py``; its path."""
    path = repository / name / str(version) / "model.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source if source is not None else MODELS[name])
    return path


# Hangs on a negative input (for the watchdog); answers others at once.
HANGS = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x.reshape(-1)[0] < 0:
                time.sleep(3600)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

# BLS to an ONNX model "add_double" (x [N, 4] -> sum = x + [1, 2, 3, 4]).
BLS_ONNX = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="add_double", requested_output_names=["sum"],
                inputs=[pb_utils.Tensor("x", x.reshape(1, 4))])
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            out = pb_utils.get_output_tensor_by_name(answer, "sum").as_numpy().reshape(4)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses
"""

MODELS["hangs"] = HANGS
MODELS["bls_onnx"] = BLS_ONNX

# Waits (up to 20 s) until its request is cancelled, then answers CANCELLED, as Triton's README
# shows; the async variant waits on the event loop.
CANCELLABLE = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        deadline = time.monotonic() + 20
        while not requests[0].is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
        return [pb_utils.InferenceResponse(error=error) for _ in requests]
"""

CANCELLABLE_ASYNC = CANCELLABLE.replace("def execute", "async def execute").replace(
    "time.sleep(0.01)", "await __import__('asyncio').sleep(0.01)"
)

MODELS["cancellable"] = CANCELLABLE
MODELS["cancellable_async"] = CANCELLABLE_ASYNC
