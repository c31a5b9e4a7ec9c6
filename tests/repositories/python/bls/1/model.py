"""Business logic scripting: forwards its two inputs to the model named by MODEL_NAME (any model
of the server with INPUT0/INPUT1 and OUTPUT0/OUTPUT1) and answers what that model answers."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            call = pb_utils.InferenceRequest(
                model_name=name.decode(),
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
                requested_output_names=["OUTPUT0", "OUTPUT1"],
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.get_output_tensor_by_name(answer, "OUTPUT0"),
                        pb_utils.get_output_tensor_by_name(answer, "OUTPUT1"),
                    ]
                )
            )
        return responses
