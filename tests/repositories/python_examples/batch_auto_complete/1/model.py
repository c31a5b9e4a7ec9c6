"""add_sub without a config.pbtxt: auto_complete_config declares its inputs and outputs
(max_batch_size 4, dynamic batching)."""

import triton_python_backend_utils as pb_utils

TENSORS = {
    "input": [{"name": f"INPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
    "output": [{"name": f"OUTPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
}


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        have = config.as_dict()
        for kind, add in (("input", config.add_input), ("output", config.add_output)):
            known = {t["name"] for t in have[kind]}
            for tensor in TENSORS[kind]:
                if tensor["name"] not in known:
                    add(tensor)
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
