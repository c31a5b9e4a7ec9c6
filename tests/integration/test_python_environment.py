"""A python model's own Python environment (Triton's ``EXECUTION_ENV_PATH``): a venv made here,
and a ``.tar.gz`` of it unpacked into the daemon's cache, run the model's instances, which import
a module that only that environment has; an environment that is missing, has no Python or no
numpy is a load error that names it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

pytestmark = pytest.mark.timeout(180)

#: returns the module only its environment has, and the prefix of the Python running it
MODEL = """
import sys
import numpy as np
import only_in_this_env
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        value = np.array([only_in_this_env.VALUE], np.int32)
        prefix = np.array([sys.prefix.encode()], dtype=object)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("VALUE", value), pb_utils.Tensor("PREFIX", prefix)])
            for _ in requests]
"""

CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "VALUE" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "PREFIX" data_type: TYPE_STRING dims: [ 1 ] }}
]
parameters: {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env}" }} }}
"""


def _venv(path: Path, *, system: bool) -> Path:
    """A venv at ``path`` (with the base Python's site-packages, numpy among them, when
    ``system``) whose site-packages hold ``only_in_this_env``."""
    flags = ["--system-site-packages"] if system else []
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *flags, str(path)], check=True)
    (site,) = path.glob("lib/python*/site-packages")
    (site / "only_in_this_env.py").write_text("VALUE = 42\n")
    return path


def _model(repo: Path, name: str, env: str) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(MODEL)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, env=env))
    return repo / name


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    repo = tmp_path_factory.mktemp("envs") / "models"
    _venv(_model(repo, "in_venv", "$$TRITON_MODEL_DIRECTORY/venv") / "venv", system=True)
    packed = _model(repo, "in_tarball", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    scratch = _venv(tmp_path_factory.mktemp("scratch") / "env", system=True)
    with tarfile.open(packed / "env.tar.gz", "w:gz") as tar:
        tar.add(scratch, arcname=".")
    shutil.rmtree(scratch)
    _model(repo, "missing", "$$TRITON_MODEL_DIRECTORY/nowhere")
    (_model(repo, "no_python", "$$TRITON_MODEL_DIRECTORY/env") / "env" / "lib").mkdir(parents=True)
    _venv(_model(repo, "no_numpy", "$$TRITON_MODEL_DIRECTORY/venv") / "venv", system=False)
    d = start_daemon(
        tmp_path_factory.mktemp("env-daemon"), "--model-repository", str(repo),
        "--model-control-mode", "explicit",
    )  # fmt: skip
    try:
        yield d
    finally:
        stop_daemon(d)


def _answer(daemon: Daemon, name: str) -> tuple[int, str]:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        client.load_model(name)
        x = httpclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        result = client.infer(name, [x])
        prefix = result.as_numpy("PREFIX")[0]
        return int(result.as_numpy("VALUE")[0]), prefix.decode()


def test_a_venv_runs_the_model(daemon: Daemon) -> None:
    value, prefix = _answer(daemon, "in_venv")
    assert value == 42
    assert prefix.endswith("in_venv/venv")


def test_a_tarball_is_unpacked_into_the_cache_and_runs_the_model(daemon: Daemon) -> None:
    value, prefix = _answer(daemon, "in_tarball")
    assert value == 42
    assert "model-runtime/python-envs/env-" in prefix


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("missing", "nowhere does not exist"),
        ("no_python", "has no Python"),
        ("no_numpy", "cannot import numpy"),
    ],
)
def test_an_environment_that_cannot_run_the_model_is_a_load_error(
    daemon: Daemon, name: str, said: str
) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        with pytest.raises(InferenceServerException) as err:
            client.load_model(name)
        assert said in str(err.value)
        assert "EXECUTION_ENV_PATH" in str(err.value) or "python" in str(err.value)
        assert not client.is_model_ready(name)
