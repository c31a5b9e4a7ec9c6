"""Decoupled: one response per element of IN (each that element; a negative element: an error
response in its place, and the stream goes on), then the final flag alone."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for value in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy():
                if value < 0:
                    error = pb_utils.TritonError(f"negative element {value}")
                    sender.send(pb_utils.InferenceResponse(error=error))
                    continue
                out = pb_utils.Tensor("OUT", np.array([value], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
