"""The daemon under poisoned requests: one model's bad data never costs the other model, the
process, or that model's good callers (the real daemon, a subprocess, on loopback)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import model_runtime.demo
from tests.integration.runner_support import Reference
from tests.integration.test_daemon_support import MODEL, infer_doc, running, samples
from tests.models import make_embedding, save

pytestmark = pytest.mark.timeout(120)


def ids_doc(ids: list[int]) -> dict[str, object]:
    return {"inputs": [{"name": "ids", "datatype": "INT64", "shape": [len(ids)], "data": ids}]}


def test_poisoned_requests_to_one_model_while_another_is_served(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    embedding = make_embedding(rows=100)
    save(embedding, repo / "embed.onnx")
    shutil.copy(Path(model_runtime.demo.__file__).parent / f"{MODEL}.onnx", repo)
    ref = Reference(embedding)
    pixels, logits = samples()
    rng = np.random.default_rng(3)
    with running(tmp_path, "--model-repository", str(repo), "--replicas", "2") as d:

        def embed(i: int) -> tuple[bool, int, object]:
            ids = [int(v) for v in rng.integers(0, 100, size=1 + i % 4)]
            bad = i % 7 == 0
            if bad:
                ids[-1] = 1000
            status, out = d.post("/v2/models/embed/infer", ids_doc(ids))
            if not bad and status == 200:
                want = ref({"ids": np.array(ids, np.int64)})["vectors"]
                got = np.array(out["outputs"][0]["data"], np.float32).reshape(want.shape)
                return bad, status, bool(np.allclose(got, want, atol=1e-6))
            return bad, status, out

        def digits(k: int) -> tuple[int, bool]:
            i = k % len(pixels)
            status, out = d.post(f"/v2/models/{MODEL}/infer", infer_doc(pixels[i : i + 1]))
            if status != 200:
                return status, False
            got = np.array(out["outputs"][0]["data"], np.float32)
            return status, bool(np.allclose(got, logits[i], atol=1e-4))

        with ThreadPoolExecutor(16) as pool:  # both models at once
            embeds_later = pool.map(embed, range(280))
            other = list(pool.map(digits, range(96)))
            embeds = list(embeds_later)

        poisoned = [(s, out) for bad, s, out in embeds if bad]
        good = [(s, ok) for bad, s, ok in embeds if not bad]
        assert len(poisoned) == 40 and all(s == 400 for s, _ in poisoned), poisoned[:3]
        assert all("INVALID_ARGUMENT" in str(out) for _, out in poisoned), poisoned[0]
        assert good and all(s == 200 and ok is True for s, ok in good), good[:5]
        assert all(s == 200 and ok for s, ok in other), [x for x in other if x != (200, True)]
        assert d.get("/v2/models/embed/ready")[0] == 200
        assert d.get(f"/v2/models/{MODEL}/ready")[0] == 200
        assert d.get("/v2/health/ready")[0] == 200
        assert d.proc.poll() is None, "the daemon is alive"
