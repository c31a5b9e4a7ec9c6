"""add_sub that counts the nanoseconds its execute calls take in a custom COUNTER,
requests_process_latency_ns{model="custom_metrics",version="1"}."""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily(
            name="requests_process_latency_ns",
            description="Cumulative time spent processing requests",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.latency = family.Metric(labels={"model": "custom_metrics", "version": "1"})

    def execute(self, requests):
        start = time.time_ns()
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        self.latency.increment(time.time_ns() - start)
        pb_utils.Logger.log_info(f"Cumulative requests processing latency: {self.latency.value()}")
        return responses
