"""BLS, synchronous: INPUT0 and INPUT1 go to the model MODEL_NAME names; its OUTPUT0 and
OUTPUT1 are the answer (its error, this request's error)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            call = pb_utils.InferenceRequest(
                model_name=target.decode(),
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            outputs = [
                pb_utils.get_output_tensor_by_name(answer, n) for n in ("OUTPUT0", "OUTPUT1")
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
