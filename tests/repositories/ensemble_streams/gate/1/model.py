"""Y = X, but an odd X is answered only once X + 1 has come too (an error response if it has
not within 2 s): two requests that are only answered if they are in the model at once."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

WAIT_S = 2.0


class TritonPythonModel:
    def initialize(self, args):
        self.came = {}

    def _came(self, value):
        return self.came.setdefault(value, asyncio.Event())

    async def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy().reshape(-1)[0])
            self._came(value).set()
            if value % 2:
                try:
                    await asyncio.wait_for(self._came(value + 1).wait(), WAIT_S)
                except TimeoutError:
                    why = f"{value} waited alone: {value + 1} did not come while it waited"
                    responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(why)))
                    continue
            out = pb_utils.Tensor("Y", np.array([value], np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
