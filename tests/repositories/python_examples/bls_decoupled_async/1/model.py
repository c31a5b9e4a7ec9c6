"""BLS to a decoupled model, twice at once: IN goes to square_int32 in two asynchronous calls
whose responses are summed: SUM = 2 * IN * IN."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException(f"unsupported batch size {len(requests)}")
        value = pb_utils.get_input_tensor_by_name(requests[0], "IN")
        calls = [
            pb_utils.InferenceRequest(
                model_name="square_int32", inputs=[value], requested_output_names=["OUT"]
            ).async_exec(decoupled=True)
            for _ in range(2)
        ]
        total = np.zeros(1, np.int32)
        for answers in await asyncio.gather(*calls):
            for answer in answers:
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                if answer.output_tensors():
                    total += pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy()
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
