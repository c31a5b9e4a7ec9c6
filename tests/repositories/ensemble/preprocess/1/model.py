"""The pre-processing step of NVIDIA's python backend ``preprocessing`` example, shrunk: raw
4x4 RGB pixels (48 bytes per image) to a normalised CHW float image."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "INPUT_0").as_numpy()
            images = raw.reshape(-1, 4, 4, 3).transpose(0, 3, 1, 2).astype(np.float32)
            out = pb_utils.Tensor("OUTPUT_0", images / 255.0 - 0.5)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
