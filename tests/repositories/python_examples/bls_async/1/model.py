"""BLS, asynchronous: one request goes to "pytorch" and to "add_sub" at once; the answer takes
OUTPUT0 from the first and OUTPUT1 from the second."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")]
            calls = [
                pb_utils.InferenceRequest(
                    model_name=name, requested_output_names=["OUTPUT0", "OUTPUT1"], inputs=inputs
                ).async_exec()
                for name in ("pytorch", "add_sub")
            ]
            first, second = await asyncio.gather(*calls)
            for answer in (first, second):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            outputs = [
                pb_utils.get_output_tensor_by_name(first, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(second, "OUTPUT1"),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
