"""Identity over two optional inputs, as Triton's ``identity_2_float32`` of ``L0_optional_input``
behaves: ``OUTPUTi`` is ``INPUTi``, or zeros shaped as the other input when ``INPUTi`` is left
out."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            given = [pb_utils.get_input_tensor_by_name(request, f"INPUT{i}") for i in (0, 1)]
            arrays = [t.as_numpy() if t is not None else None for t in given]
            like = next(a for a in arrays if a is not None)
            out = [
                pb_utils.Tensor(f"OUTPUT{i}", a if a is not None else np.zeros_like(like))
                for i, a in enumerate(arrays)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
