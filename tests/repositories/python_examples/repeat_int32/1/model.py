"""Decoupled: each element of IN becomes one response (OUT that element, IDX its index), DELAY
milliseconds apart, sent from a thread while execute waits WAIT milliseconds and returns."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException(f"unsupported batch size {len(requests)}")
        request = requests[0]
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
        if values.shape != delays.shape:
            raise pb_utils.TritonModelException(
                f"expected IN and DELAY shape to match, got {list(values.shape)} and "
                f"{list(delays.shape)}."
            )
        sender = request.get_response_sender()
        thread = threading.Thread(target=self.answer, args=(sender, values, delays))
        thread.start()
        self.threads.append(thread)
        wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()[0]
        time.sleep(wait / 1000)
        return None

    def answer(self, sender, values, delays):
        for index, (value, delay) in enumerate(zip(values, delays, strict=True)):
            time.sleep(delay / 1000)
            outputs = [
                pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
            ]
            sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
