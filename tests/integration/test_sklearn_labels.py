"""A scikit-learn classifier with string class labels, converted to ONNX with skl2onnx
(``zipmap`` off: a ``label`` STRING tensor and a ``probabilities`` FLOAT tensor), compiled by
the daemon and served over HTTP and gRPC with Triton's clients: each row's label is the name
scikit-learn predicts, and the probabilities are its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

pytestmark = pytest.mark.timeout(120)

SPECIES = np.array(["setosa", "versicolor", "virginica"])


@pytest.fixture(scope="module")
def iris() -> tuple[np.ndarray, np.ndarray, object]:
    # Imported here, not at the top: scikit-learn and skl2onnx take ~3 s of CPU to import, and
    # every xdist worker imports every module it collects, not only the ones it runs.
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    clf = LogisticRegression(max_iter=500).fit(x, SPECIES[y])
    return x, SPECIES[y], clf


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, iris: tuple[np.ndarray, np.ndarray, object]
) -> Iterator[Daemon]:
    from skl2onnx import to_onnx

    x, _, clf = iris
    onnx_model = to_onnx(clf, x[:1], options={"zipmap": False}, target_opset=17)
    tmp = tmp_path_factory.mktemp("sklearn")
    path: Path = tmp / "iris.onnx"
    path.write_bytes(onnx_model.SerializeToString())
    d = start_daemon(tmp, f"iris={path}")
    yield d
    stop_daemon(d)


def _rows(iris: tuple[np.ndarray, np.ndarray, object]) -> tuple[np.ndarray, list[str], np.ndarray]:
    x, _, clf = iris
    rows = x[[0, 60, 120, 1, 75]]  # each species, within one batch
    labels = [str(v) for v in clf.predict(rows)]  # type: ignore[attr-defined]
    assert set(labels) == set(SPECIES)
    return rows, labels, clf.predict_proba(rows)  # type: ignore[attr-defined]


def test_metadata_says_a_string_label_and_float_probabilities(daemon: Daemon) -> None:
    status, meta = daemon.get("/v2/models/iris")
    assert status == 200
    assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
    outputs = {o["name"]: (o["datatype"], o["shape"]) for o in meta["outputs"]}
    assert outputs == {"label": ("BYTES", [-1]), "probabilities": ("FP32", [-1, 3])}


def test_labels_over_http(daemon: Daemon, iris: tuple[np.ndarray, np.ndarray, object]) -> None:
    rows, labels, proba = _rows(iris)
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        for binary in (True, False):
            x = httpclient.InferInput("X", list(rows.shape), "FP32")
            x.set_data_from_numpy(rows, binary_data=binary)
            outputs = [httpclient.InferRequestedOutput(n, binary_data=binary)
                       for n in ("label", "probabilities")]  # fmt: skip
            result = client.infer("iris", [x], outputs=outputs)
            got = result.as_numpy("label").tolist()
            got = [v.decode() if isinstance(v, bytes) else v for v in got]
            assert got == labels
            np.testing.assert_allclose(result.as_numpy("probabilities"), proba, atol=1e-5)
    # Plain JSON, as a curl user sends it: the labels come back as JSON strings.
    status, out = daemon.post(
        "/v2/models/iris/infer",
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [5, 4],
                     "data": rows.ravel().tolist()}]},
    )  # fmt: skip
    assert status == 200, out
    label = next(o for o in out["outputs"] if o["name"] == "label")
    assert (label["datatype"], label["data"]) == ("BYTES", labels)


def test_labels_over_grpc(daemon: Daemon, iris: tuple[np.ndarray, np.ndarray, object]) -> None:
    rows, labels, proba = _rows(iris)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        x = grpcclient.InferInput("X", list(rows.shape), "FP32")
        x.set_data_from_numpy(rows)
        result = client.infer("iris", [x])
        assert [v.decode() for v in result.as_numpy("label")] == labels
        np.testing.assert_allclose(result.as_numpy("probabilities"), proba, atol=1e-5)
