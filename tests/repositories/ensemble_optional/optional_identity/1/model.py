"""Identity over two optional inputs that writes only the outputs of the inputs it was given
(Triton's ``optional_identity`` of ``L0_optional_input``)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            out = []
            for i in (0, 1):
                tensor = pb_utils.get_input_tensor_by_name(request, f"INPUT{i}")
                if tensor is not None:
                    out.append(pb_utils.Tensor(f"OUTPUT{i}", tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
