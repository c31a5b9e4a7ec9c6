"""Decoupled: one response per element of IN (each that element), then the final flag alone."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for value in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy():
                out = pb_utils.Tensor("OUT", np.array([value], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
