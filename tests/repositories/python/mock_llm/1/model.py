"""A stand-in for a language model, as Triton's generate endpoint tests drive one: it answers
PROMPT back as TEXT. With STREAM true it sends TEXT REPETITION times (request parameter, 1 by
default; DELAY seconds before each), then the final flag alone, or with FAIL_LAST an error as
the final response; with STREAM false one response that is also the final one. OUTPUT_0_DIM:
TEXT is an empty tensor."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            sender = request.get_response_sender()
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            stream = bool(
                pb_utils.get_input_tensor_by_name(request, "STREAM").as_numpy().ravel()[0]
            )
            text = np.array([]) if params.get("OUTPUT_0_DIM", False) else prompt
            answer = pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)])
            if not stream:
                sender.send(answer, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for _ in range(params.get("REPETITION", 1)):
                if "DELAY" in params:
                    time.sleep(params["DELAY"])
                if sender.is_cancelled():
                    break
                sender.send(answer)
            last = None
            if params.get("FAIL_LAST", False):
                last = pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred"))
            sender.send(last, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
