"""The post-processing step: the classifier's scores to the top class and its label (``class_``
and the class, or the request's ``label_prefix`` parameter and the class)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            scores = pb_utils.get_input_tensor_by_name(request, "INPUT_0").as_numpy()
            top = scores.argmax(axis=1).astype(np.int32).reshape(-1, 1)
            prefix = json.loads(request.parameters() or "{}").get("label_prefix", "class_")
            labels = np.array([[f"{prefix}{k}".encode()] for k in top[:, 0]], dtype=object)
            out = [pb_utils.Tensor("OUTPUT_0", labels), pb_utils.Tensor("OUTPUT_1", top)]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
