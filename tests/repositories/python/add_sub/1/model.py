"""OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, with the dtypes the config gives."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtypes = [
            pb_utils.triton_string_to_numpy(
                pb_utils.get_output_config_by_name(config, name)["data_type"]
            )
            for name in ("OUTPUT0", "OUTPUT1")
        ]

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            sum_, diff = (a + b).astype(self.dtypes[0]), (a - b).astype(self.dtypes[1])
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", sum_),
                        pb_utils.Tensor("OUTPUT1", diff),
                    ]
                )
            )
        return responses

    def finalize(self):
        pass
