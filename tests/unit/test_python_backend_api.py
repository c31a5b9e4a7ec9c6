"""Triton's Python API (``triton_python_backend_utils``) as a model uses it, in process."""

from __future__ import annotations

import json

import numpy as np
import pytest

from model_runtime.python_backend import pb_utils
from model_runtime.python_backend.pb_bridge import TritonModelException


def test_tensors_from_numpy_and_back() -> None:
    t = pb_utils.Tensor("X", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert t.name() == "X" and t.is_cpu() and t.shape() == [2, 3] and t.triton_dtype() == "FP32"
    strings = pb_utils.Tensor("S", np.array([b"a", b"b"], dtype=object))
    assert strings.triton_dtype() == "BYTES"
    with pytest.raises(TritonModelException, match="needs a numpy array, not a list"):
        pb_utils.Tensor("L", [1, 2])
    with pytest.raises(TritonModelException, match="complex128 has no Triton data type"):
        pb_utils.Tensor("C", np.zeros(2, np.complex128))


def test_dlpack_round_trip_for_cpu_tensors() -> None:
    t = pb_utils.Tensor("X", np.arange(4, dtype=np.int32))
    back = pb_utils.Tensor.from_dlpack("Y", t.to_dlpack())  # a bare capsule, as torch makes
    np.testing.assert_array_equal(back.as_numpy(), np.arange(4))
    again = pb_utils.Tensor.from_dlpack("Z", np.arange(3.0))  # an object with __dlpack__
    assert again.triton_dtype() == "FP64"
    with pytest.raises(TritonModelException, match="no DLPack form"):
        pb_utils.Tensor("S", np.array([b"a"], dtype=object)).to_dlpack()


def test_type_tables_are_tritons() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is bool
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    assert pb_utils.triton_to_numpy_type(99) is None
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2


def test_responses_errors_and_parameters() -> None:
    error = pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    response = pb_utils.InferenceResponse(error=error, parameters={"a": 1, "b": "x"})
    assert response.has_error() and response.error().code() == 2
    assert json.loads(response.parameters()) == {"a": 1, "b": "x"}
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    out = pb_utils.Tensor("O", np.ones(1))
    assert pb_utils.get_output_tensor_by_name(pb_utils.InferenceResponse([out]), "O") is out
    with pytest.raises(TritonModelException, match="values bool, int, float or str"):
        pb_utils.InferenceResponse(parameters={"a": [1]})


def test_a_bls_request_is_built_as_tritons() -> None:
    x = pb_utils.Tensor("X", np.ones(2))
    request = pb_utils.InferenceRequest(
        model_name="m", inputs=[x], requested_output_names=["Y"], correlation_id="s-1",
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, parameters={"k": "v"},
    )  # fmt: skip
    assert pb_utils.get_input_tensor_by_name(request, "X") is x
    assert request.requested_output_names() == ["Y"] and request.correlation_id() == "s-1"
    assert json.loads(request.parameters()) == {"k": "v"}
    with pytest.raises(TritonModelException, match="only inside a python model's instance"):
        request.exec()
    with pytest.raises(TritonModelException, match="has a response sender"):
        request.get_response_sender()
    with pytest.raises(TritonModelException, match="inside a python model's instance"):
        pb_utils.Logger.log_info("x")


def test_model_config_completion_and_its_conflicts() -> None:
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 4, "input": [
        {"name": "A", "data_type": "TYPE_FP32", "dims": [2]}]}))  # fmt: skip
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})
    config.add_output({"name": "B", "data_type": "TYPE_INT32", "dims": [-1]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    d = config.as_dict()
    assert d["max_batch_size"] == 8 and config.max_batch_size() == 8
    assert d["output"] == [{"name": "B", "data_type": "TYPE_INT32", "dims": [-1]}]
    assert d["dynamic_batching"] == {} and d["model_transaction_policy"] == {"decoupled": True}
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32"):
        config.add_input({"name": "A", "data_type": "TYPE_INT8", "dims": [2]})
    with pytest.raises(ValueError, match="the model expects dims"):
        config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_output({"name": "C", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="property other than"):
        config.add_output({"name": "C", "data_type": "TYPE_FP32", "dims": [1], "x": 1})
    with pytest.raises(ValueError, match="specified max_batch_size 8"):
        config.set_max_batch_size(2)
    with pytest.raises(ValueError, match="change decoupled"):
        config.set_model_transaction_policy({"decoupled": False})
    assert pb_utils.using_decoupled_model_transaction_policy(d)
    assert pb_utils.get_input_config_by_name(d, "A") == {
        "name": "A", "data_type": "TYPE_FP32", "dims": [2]}  # fmt: skip
    assert pb_utils.get_output_config_by_name(d, "Z") is None
